"""`raytrainer consolidate`: a sharded (DCP) checkpoint's model as one `model.safetensors`, offline.

Streamed: the safetensors header is computed from DCP's metadata (names, shapes, dtypes), then each tensor
is read from the shards (DCP reads only the byte ranges it needs, from any fsspec URL), written, and
dropped. Memory holds one tensor at a time, never the whole model. No process group is needed.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from typing import Optional

import torch

from ..errors import ConfigError
from ..storage import exists, is_local, join, local_path, read_bytes
from ..storage.upload import upload_dir
from .damage import verify
from .manifest import read_manifest
from .sharded import MODEL_DIR, dcp_reader, is_sharded
from .snapshot import MODEL_FILE

CONFIG_FILE = "config.json"
_DTYPES = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16",
           torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
           torch.bool: "BOOL"}


def consolidate(ckpt_url: str, out_url: Optional[str] = None, storage_options: Optional[dict] = None) -> str:
    """Write `model.safetensors` (and a transformers config.json, when the checkpoint has one) for the sharded
    checkpoint `ckpt_url` into `out_url` (default: the checkpoint itself). Returns the file's URL."""
    out_url = out_url or ckpt_url
    manifest = read_manifest(ckpt_url, storage_options)
    if manifest is None:
        raise ConfigError(f"{ckpt_url} is not a committed checkpoint (missing, or its write never finished): "
                          "`raytrainer checkpoints OUTPUT_DIR` lists the committed ones.")
    damage = verify(ckpt_url, storage_options, manifest)  # every file against its checksum, before any is read
    if damage is not None:
        raise damage
    if not is_sharded(ckpt_url, storage_options):
        raise ConfigError(f"{ckpt_url} is not a sharded FSDP checkpoint (no {MODEL_DIR}/): its weights are "
                          f"already in {MODEL_FILE}.")
    staging = local_path(out_url) if is_local(out_url) else tempfile.mkdtemp(prefix="raytrainer-consolidate-")
    try:
        os.makedirs(staging, exist_ok=True)
        _write_safetensors(join(ckpt_url, MODEL_DIR), os.path.join(staging, MODEL_FILE), storage_options)
        if exists(join(ckpt_url, CONFIG_FILE), storage_options):
            with open(os.path.join(staging, CONFIG_FILE), "wb") as f:
                f.write(read_bytes(join(ckpt_url, CONFIG_FILE), storage_options))
        if not is_local(out_url):
            upload_dir(staging, out_url, storage_options)  # file by file: never creates a bucket
    finally:
        if not is_local(out_url):
            shutil.rmtree(staging, ignore_errors=True)
    return join(out_url, MODEL_FILE)


def _write_safetensors(dcp_url: str, path: str, storage_options: Optional[dict]):
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    metadata = dcp_reader(dcp_url, storage_options).read_metadata()
    tensors = sorted((name, meta) for name, meta in metadata.state_dict_metadata.items()
                     if isinstance(meta, TensorStorageMetadata))
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, meta in tensors:
        dtype = meta.properties.dtype
        if dtype not in _DTYPES:
            raise ConfigError(f"{name} has dtype {dtype}, which safetensors cannot hold.")
        size = meta.size.numel() * dtype.itemsize
        header[name] = {"dtype": _DTYPES[dtype], "shape": list(meta.size), "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(encoded)))
        f.write(encoded)
        for name, meta in tensors:
            tensor = torch.empty(meta.size, dtype=meta.properties.dtype)
            _load_state_dict({name: tensor}, storage_reader=dcp_reader(dcp_url, storage_options),
                             planner=DefaultLoadPlanner(), no_dist=True)
            f.write(tensor.contiguous().view(-1).view(torch.uint8).numpy().data)
