"""Checksums: xxh3 for new checkpoints; manifests written with crc32 (before xxh3) still verify, each file with
the algorithm its manifest names; an algorithm this version does not know is passed over (sizes still count)."""

import zlib

import pytest

from raytrainer.storage.integrity import ALGORITHM, CheckpointDamagedError, HashingFile, check_bytes, of_bytes


def manifest(name, data, checksum):
    return {"format": 2, "step": 1, "files": {name: len(data)}, "checksums": {name: checksum}}


def test_new_checksums_are_xxh3_and_taken_as_the_bytes_are_written(tmp_path):
    assert ALGORITHM == "xxh3" and of_bytes(b"abc").startswith("xxh3:")
    with open(tmp_path / "f", "wb") as raw:
        hashing = HashingFile(raw)
        hashing.write(b"ab")
        hashing.write(memoryview(b"c"))
    assert hashing.checksum.hexdigest() == of_bytes(b"abc") == of_bytes((tmp_path / "f").read_bytes())


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
