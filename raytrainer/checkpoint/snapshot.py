"""What a checkpoint holds, captured in memory so it can be written while training goes on.

`to_host` is the only part that stalls training: it copies the state off the device (and clones CPU
tensors, which the next optimizer step would otherwise change under the writer) into a `Snapshot`. Everything
after it (serialisation, upload, commit) happens in the background (see writer.py).
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np
import torch

from ..storage.integrity import HashingFile, of_bytes
from .listing import TRAINER_STATE_NAME as TRAINER_STATE_FILE

MODEL_FILE = "model.safetensors"
MODEL_INDEX_FILE = "model.safetensors.index.json"
OPTIMIZER_FILE = "optimizer.pt"
SCHEDULER_FILE = "scheduler.pt"
ARGS_FILE = "training_args.json"


def rng_file(rank: int) -> str:
    return f"rng_state_{rank}.pth"


def get_rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "cpu": torch.random.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.random.get_rng_state_all()
    return state


def set_rng_state(state: dict):
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.random.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.random.set_rng_state_all(state["cuda"])


def to_host(tree: Any) -> Any:
    """A copy of every tensor in a nested structure, on the CPU (a clone even when already there)."""
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    if isinstance(tree, dict):
        return {k: to_host(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(to_host(v) for v in tree)
    return tree


@dataclass
class Snapshot:
    step: int
    model_state: Dict[str, torch.Tensor]
    model: Any  # the unwrapped module: only its class/config are used when writing (save_pretrained)
    optimizer_state: Optional[dict]
    scheduler_state: Optional[dict]
    rng_states: List[dict]
    trainer_state_json: str
    args_json: str
    extra: dict = field(default_factory=dict)

    def write_state_files(self, directory: str) -> Dict[str, str]:
        """Write every file except the model weights into a local directory, serialising straight to disk
        (no in-memory copy of the optimizer state). Returns {file: checksum}, taken as the bytes were written."""
        checksums = {}
        for name, text in ((TRAINER_STATE_FILE, self.trainer_state_json), (ARGS_FILE, self.args_json)):
            data = text.encode("utf-8")
            with open(os.path.join(directory, name), "wb") as f:
                f.write(data)
            checksums[name] = of_bytes(data)
        objects = {OPTIMIZER_FILE: self.optimizer_state, SCHEDULER_FILE: self.scheduler_state}
        objects.update({rng_file(rank): rng for rank, rng in enumerate(self.rng_states)})
        with without_zip_crc32():
            for name, obj in objects.items():
                if obj is not None:
                    with open(os.path.join(directory, name), "wb") as raw:
                        hashing = HashingFile(raw)
                        torch.save(obj, hashing)
                    checksums[name] = hashing.checksum.hexdigest()
        return checksums


_CRC_LOCK = threading.Lock()


@contextlib.contextmanager
def without_zip_crc32():
    """torch.save computes a CRC32 of every record of its zip file, a large part of the cost of saving an
    optimizer state (figures: benchmarks/README.md). Our manifest already holds a checksum of the whole file,
    verified before a resume, so ours are saved without it (torch.load reads such files as any other). The
    setting is process-wide: a torch.save of another thread meanwhile also writes its file without the zip
    CRC32s, which torch.load reads all the same."""
    from torch.utils.serialization import config

    with _CRC_LOCK:
        before, config.save.compute_crc32 = config.save.compute_crc32, False
        try:
            yield
        finally:
            config.save.compute_crc32 = before


def torch_from_bytes(data: bytes) -> Any:
    # Our own files hold numpy RNG state and python objects, so weights_only loading is not enough.
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=False)

