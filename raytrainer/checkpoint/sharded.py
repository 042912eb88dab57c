"""Sharded checkpoints under FSDP: every rank writes its own shards with torch.distributed.checkpoint (DCP),
through fsspec (local disk, S3, ...), and reads back whatever part of each tensor it now owns: a checkpoint
written by N ranks loads on M ranks (DCP plans the resharding from the tensors' global offsets).

Layout, with Hugging Face's directory names (accelerate writes FSDP checkpoints the same way):

    checkpoint-{step}/pytorch_model_fsdp_0/   .metadata (rank 0) + __{rank}_0.distcp (each rank's shards)
    checkpoint-{step}/optimizer_0/            the optimizer state, keyed by parameter name, same scheme

Every other file (trainer_state.json, scheduler.pt, rng_state_*.pth, training_args.json) and the commit
marker are rank 0's, written after every rank's shards are durable (see manager.py).
"""

from __future__ import annotations

import contextlib
import re
import warnings
from typing import Optional

from torch import nn

from ..storage import exists, fsspec_options, get_fs, is_local, join, local_path
from ..storage.integrity import ALGORITHM, algorithm_of, of_stream

MODEL_DIR = "pytorch_model_fsdp_0"
OPTIMIZER_DIR = "optimizer_0"


def is_sharded(ckpt_url: str, storage_options: Optional[dict] = None) -> bool:
    return exists(join(ckpt_url, MODEL_DIR), storage_options)


_RANK_FILE = re.compile(r"__(\d+)_\d+\.distcp$")


def _owner(name: str, world_size: int) -> int:
    """The rank that wrote a DCP file (`__{rank}_{n}.distcp`); rank 0 for the rest (.metadata, config...)."""
    match = _RANK_FILE.search(name)
    return int(match.group(1)) % max(world_size, 1) if match else 0


def shard_checksums(ckpt_url: str, files: dict, rank: int, world_size: int,
                    storage_options: Optional[dict] = None, algorithms: Optional[dict] = None) -> dict:
    """Checksums of this rank's share of the DCP files under `ckpt_url` (those it wrote): DCP writes them
    itself, so they are read back once, each rank its own, in parallel. `algorithms`: {file: algorithm} to
    check a committed manifest's (default: the current one)."""
    checksums = {}
    for name in sorted(files):
        if name.startswith((MODEL_DIR + "/", OPTIMIZER_DIR + "/")) and _owner(name, world_size) == rank:
            fs, path = get_fs(join(ckpt_url, name), storage_options)
            with fs.open(path, "rb") as f:
                checksums[name] = of_stream(f, (algorithms or {}).get(name, ALGORITHM)).hexdigest()
    return checksums


def shard_damage(ckpt_url: str, manifest: Optional[dict], rank: int, world_size: int,
                 storage_options: Optional[dict] = None):
    """(file, problem) for the first of this rank's share of DCP files whose checksum differs from the
    manifest's; None when they match (or the manifest has no checksums). DCP reads byte ranges itself, so the
    files are checked before it loads them."""
    expected = {name: value for name, value in ((manifest or {}).get("checksums") or {}).items()
                if algorithm_of(value) is not None}
    found = shard_checksums(ckpt_url, {name: 0 for name in expected}, rank, world_size, storage_options,
                            {name: algorithm_of(value) for name, value in expected.items()})
    for name, value in sorted(found.items()):
        if value != expected[name]:
            return name, f"its content changed since it was committed (checksum {value}, committed {expected[name]})"
    return None


def strategy_mismatch(what: str, sharded_strategy: bool) -> str:
    """Why checkpoint `what` (its URL, or the argument naming it) cannot be resumed under this strategy: a full
    checkpoint under FSDP (`sharded_strategy`), or a sharded one under DDP or on a single device."""
    if sharded_strategy:
        return (f"{what} is a full (DDP) checkpoint, but strategy='fsdp' resumes from sharded ones: resume it with "
                "strategy='ddp', or start the FSDP run from its weights.")
    return (f"{what} is a sharded FSDP checkpoint ({MODEL_DIR}/): resume it with strategy='fsdp', or turn it into "
            "model.safetensors with `raytrainer consolidate` and start a new run from those weights.")


def dcp_writer(url: str, storage_options: Optional[dict]):
    """DCP's storage writer for `url`: the local one on local disk, else fsspec's, opened with the options of
    every other storage access (storage.fsspec_options: other ranks' files must be visible at once)."""
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    if is_local(url):
        return FileSystemWriter(local_path(url), single_file_per_rank=True, sync_files=True)
    return FsspecWriter(url, single_file_per_rank=True, **fsspec_options(url, storage_options))


def dcp_reader(url: str, storage_options: Optional[dict]):
    """DCP's storage reader for `url` (see dcp_writer)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    if is_local(url):
        return FileSystemReader(local_path(url))
    return FsspecReader(url, **fsspec_options(url, storage_options))


@contextlib.contextmanager
def one_process_is_intended():
    """DCP warns when it runs without a process group; for num_workers=0 that is what we mean."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def save_sharded(model: nn.Module, optimizer, ckpt_url: str, storage_options: Optional[dict] = None):
    """Collective: every rank writes its shards of the model (and the optimizer, when given)."""
    with one_process_is_intended():
        _save_sharded(model, optimizer, ckpt_url, storage_options)


def _save_sharded(model: nn.Module, optimizer, ckpt_url: str, storage_options: Optional[dict]):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    dcp.save(get_model_state_dict(model), storage_writer=dcp_writer(join(ckpt_url, MODEL_DIR), storage_options))
    if optimizer is not None:
        state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
        dcp.save(state, storage_writer=dcp_writer(join(ckpt_url, OPTIMIZER_DIR), storage_options))


def load_sharded(model: nn.Module, optimizer, ckpt_url: str, storage_options: Optional[dict] = None):
    """Collective: load this rank's part of the model (and optimizer) state, whatever world size wrote it."""
    with one_process_is_intended():
        _load_sharded(model, optimizer, ckpt_url, storage_options)


def _load_sharded(model: nn.Module, optimizer, ckpt_url: str, storage_options: Optional[dict]):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    model_state = get_model_state_dict(model)
    try:
        dcp.load(model_state, storage_reader=dcp_reader(join(ckpt_url, MODEL_DIR), storage_options))
    except Exception as exc:  # DCP names missing keys / shape mismatches; say which checkpoint and model
        raise RuntimeError(f"Checkpoint {ckpt_url} does not match the model ({type(model).__name__}): {exc}") \
            from exc
    set_model_state_dict(model, model_state)
    if optimizer is not None:
        # A fresh optimizer has no state yet: get_optimizer_state_dict creates it (a zero-lr step), so DCP has
        # tensors of the right shape and sharding to load into.
        state = {"optimizer": get_optimizer_state_dict(model, optimizer)}
        dcp.load(state, storage_reader=dcp_reader(join(ckpt_url, OPTIMIZER_DIR), storage_options))
        set_optimizer_state_dict(model, optimizer, state["optimizer"])
