"""FSDP2 on real Ray Train worker groups (gloo on CPU): the same run as DDP, step for step."""

import os

import pytest
import safetensors.torch

from raytrainer.cli.commands import main as cli
from tests.blocks_model import train_blocks
from tests.models import assert_same_weights, weights

pytestmark = pytest.mark.usefixtures("ray_session")


def test_two_worker_fsdp_ends_where_two_worker_ddp_does(tmp_path):
    """AdamW, clipping that engages (max_grad_norm 0.5), accumulation 2: the clipped norm is computed over
    DTensor shards, and accumulation skips the reduce-scatter on the first micro-step. HF's ZeRO-2 spelling
    with offload (a no-op on CPU); plain full_shard is the reference run of test_reshard.py, which the DDP
    run there matches too."""
    # Evaluation every 3 steps on 13 samples in batches of 3: rank 0 has 3 batches, rank 1 two, and under FSDP
    # every forward pass gathers with the other rank, so rank 1 must run a third one.
    evaluation = dict(eval_n=13, eval_strategy="steps", eval_steps=3, per_device_eval_batch_size=3)
    ddp = train_blocks(str(tmp_path / "ddp"), strategy="ddp", gradient_accumulation_steps=2, **evaluation)
    fsdp = train_blocks(str(tmp_path / "fsdp"), fsdp="shard_grad_op offload auto_wrap", gradient_accumulation_steps=2,
                        save_strategy="steps", save_steps=6, **evaluation)
    assert fsdp.args.strategy == "fsdp"
    assert_same_weights(weights(fsdp.model), weights(ddp.model))
    norms = lambda t: [h["grad_norm"] for h in t.state.log_history if "grad_norm" in h]  # noqa: E731
    assert len(norms(fsdp)) == 6 and max(norms(ddp)) > 0.5  # clipping was active
    assert norms(fsdp) == pytest.approx(norms(ddp), rel=1e-4)
    evals = lambda t: [h["eval_loss"] for h in t.state.log_history if "eval_loss" in h]  # noqa: E731
    assert len(evals(fsdp)) == 2 and evals(fsdp) == pytest.approx(evals(ddp), rel=1e-4)

    # Offline consolidation of the last checkpoint (each rank wrote half of every block) gives the weights
    # the driver got back.
    ckpt = str(tmp_path / "fsdp" / "checkpoint-6")
    assert sorted(os.listdir(os.path.join(ckpt, "pytorch_model_fsdp_0"))) == [".metadata", "__0_0.distcp",
                                                                              "__1_0.distcp"]
    assert cli(["consolidate", ckpt, str(tmp_path / "exported")]) == 0
    exported = safetensors.torch.load_file(str(tmp_path / "exported" / "model.safetensors"))
    assert_same_weights(exported, weights(fsdp.model), atol=0)
