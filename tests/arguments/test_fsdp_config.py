"""transformers' fsdp / fsdp_config arguments (fsdp_config.py), in accelerate's spelling too."""

import pytest

from raytrainer import ConfigError, TrainingArguments


def test_fsdp_config_in_accelerates_spelling():
    with pytest.warns(UserWarning, match="fsdp_use_orig_params.*FSDP1"):
        args = TrainingArguments(fsdp=True, fsdp_config={
            "fsdp_transformer_layer_cls_to_wrap": "GPT2Block,GPT2MLP", "fsdp_sharding_strategy": "SHARD_GRAD_OP",
            "fsdp_offload_params": "true", "fsdp_state_dict_type": "SHARDED_STATE_DICT", "fsdp_version": 2,
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "fsdp_use_orig_params": True,
            "fsdp_cpu_ram_efficient_loading": False, "fsdp_activation_checkpointing": "false"})
    assert args.strategy == "fsdp"
    assert args.fsdp_config == {"transformer_layer_cls_to_wrap": ["GPT2Block", "GPT2MLP"],
                                "reshard_after_forward": False, "cpu_offload": True, "activation_checkpointing": False}
    for config, match in (({"fsdp_sharding_strategy": "HYBRID_SHARD"}, "strategy='ddp'"),
                          ({"fsdp_auto_wrap_policy": "SIZE_BASED_WRAP"}, "auto_wrap_policy"),
                          ({"fsdp_cpu_ram_efficient_loading": True}, "object store"),
                          ({"fsdp_bogus": 1}, "unknown key 'fsdp_bogus'")):
        with pytest.raises(ConfigError, match=match):
            TrainingArguments(fsdp=True, fsdp_config=config)

