"""A checkpoint's state as written (raytrainer/checkpoint/snapshot.py): torch.save's per-record CRC32 left to the
manifest's checksum of the whole file. Local disk and S3 (moto)."""

from __future__ import annotations

import io
import zipfile

import torch

from raytrainer import storage
from raytrainer.checkpoint.damage import verify
from tests.checkpoint.test_integrity import _save


def test_state_files_leave_torchs_zip_crc32_to_our_checksum_and_load_as_any(store):
    """torch.save's per-record CRC32 is a large part of saving an optimizer state: ours are written without it (the
    manifest's checksum of the whole file is verified instead), and torch's setting is back after the save."""
    from torch.utils.serialization import config

    url = _save(store, 3)
    assert config.save.compute_crc32 is True
    data = storage.read_bytes(storage.join(url, "optimizer.pt"), store.options)
    assert zipfile.ZipFile(io.BytesIO(data)).testzip() is not None  # a zip reader that checks CRCs objects
    assert torch.load(io.BytesIO(data), weights_only=False) == {"state": {}, "param_groups": []}
    assert verify(url, store.options) is None
