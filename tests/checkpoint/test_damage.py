"""A file's bytes against its manifest (checkpoint/damage.py's check_bytes): manifests written with crc32 (before
xxh3) still verify, each file with the algorithm its manifest names; an algorithm this version does not know is
passed over (sizes still count). That new checksums are xxh3: tests/storage/test_integrity.py."""

import zlib

import pytest

from raytrainer.checkpoint.damage import CheckpointDamagedError, check_bytes
from raytrainer.storage.integrity import of_bytes


def manifest(name, data, checksum):
    return {"format": 2, "step": 1, "files": {name: len(data)}, "checksums": {name: checksum}}


@pytest.mark.parametrize("algorithm", ["xxh3", "crc32"])
def test_a_manifest_verifies_with_the_algorithm_it_names(algorithm):
    data = b"weights" * 100
    committed = manifest("optimizer.pt", data, of_bytes(data, algorithm))
    if algorithm == "crc32":
        assert committed["checksums"]["optimizer.pt"] == f"crc32:{zlib.crc32(data):08x}"
    check_bytes("ckpt", "optimizer.pt", data, committed)
    with pytest.raises(CheckpointDamagedError, match="content changed"):
        check_bytes("ckpt", "optimizer.pt", b"Weights" + data[7:], committed)


def test_an_unknown_algorithm_is_checked_by_size_only():
    data = b"x" * 10
    check_bytes("ckpt", "a.bin", b"y" * 10, manifest("a.bin", data, "sha999:00"))
    with pytest.raises(CheckpointDamagedError, match="bytes"):
        check_bytes("ckpt", "a.bin", b"y" * 9, manifest("a.bin", data, "sha999:00"))
