"""`raytrainer consolidate` (raytrainer/checkpoint/consolidate.py): a committed sharded (DCP) checkpoint's model as
one model.safetensors, streamed tensor by tensor, with every dtype safetensors holds, on local disk and on S3; a
checkpoint that is not committed or not sharded is refused naming what to do. After a real FSDP run:
tests/checkpoint/test_sharded.py; a damaged one refused on the command line: tests/cli/test_commands.py."""

from __future__ import annotations

import pytest
import safetensors.torch
import torch
import torch.distributed.checkpoint as dcp

from raytrainer.checkpoint import manifest
from raytrainer.checkpoint.consolidate import consolidate
from raytrainer.checkpoint.sharded import MODEL_DIR, dcp_writer
from raytrainer.errors import ConfigError
from raytrainer.storage import read_bytes


def state() -> dict:
    generator = torch.Generator().manual_seed(0)
    return {"embed.weight": torch.randn(7, 5, generator=generator).to(torch.bfloat16),
            "layers.0.weight": torch.randn(3, 5, generator=generator),
            "layers.0.bias": torch.randn(3, generator=generator).to(torch.float16),
            "position_ids": torch.arange(11, dtype=torch.int64),
            "mask": torch.tensor([True, False, True]),
            "scale": torch.tensor(2.5, dtype=torch.float64)}


def test_a_sharded_checkpoints_model_becomes_one_safetensors_file(store):
    url = store.join("checkpoint-6")
    written = state()
    dcp.save(written, storage_writer=dcp_writer(f"{url}/{MODEL_DIR}", store.options), no_dist=True)
    store.write("checkpoint-6/config.json", b'{"model_type": "tiny"}')
    manifest.commit(url, 6, store.options)
    out = store.join("exported")
    path = consolidate(url, out, store.options)
    assert path == store.join("exported", "model.safetensors")
    loaded = safetensors.torch.load(read_bytes(path, store.options))
    assert loaded.keys() == written.keys()
    for name, tensor in written.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name
    assert read_bytes(store.join("exported", "config.json"), store.options) == b'{"model_type": "tiny"}'


def test_an_uncommitted_or_unsharded_checkpoint_is_refused(store):
    url = store.join("checkpoint-2")
    store.write("checkpoint-2/model.safetensors", b"x" * 16)
    with pytest.raises(ConfigError, match="is not a committed checkpoint.*raytrainer checkpoints OUTPUT_DIR"):
        consolidate(url, None, store.options)
    manifest.commit(url, 2, store.options)
    with pytest.raises(ConfigError, match=f"is not a sharded FSDP checkpoint \\(no {MODEL_DIR}/\\)"):
        consolidate(url, None, store.options)
