"""Checksums (raytrainer/storage/integrity.py): xxh3 for what is written now, taken as the bytes pass; crc32
still computed for what older versions wrote; a stored checksum names its algorithm."""

import io
import zlib

from raytrainer.storage.integrity import ALGORITHM, CHUNK, HashingFile, algorithm_of, of_bytes, of_stream


def test_new_checksums_are_xxh3_and_taken_as_the_bytes_are_written(tmp_path):
    assert ALGORITHM == "xxh3" and of_bytes(b"abc").startswith("xxh3:")
    with open(tmp_path / "f", "wb") as raw:
        hashing = HashingFile(raw)
        hashing.write(b"ab")
        hashing.write(memoryview(b"c"))
    assert hashing.checksum.hexdigest() == of_bytes(b"abc") == of_bytes((tmp_path / "f").read_bytes())


def test_a_stream_is_read_in_chunks_to_the_same_checksum():
    data = bytes(range(256)) * (CHUNK // 256 + 3)  # more than one chunk
    for algorithm in ("xxh3", "crc32"):
        checksum = of_stream(io.BytesIO(data), algorithm)
        assert checksum.hexdigest() == of_bytes(data, algorithm) and checksum.size == len(data)
    assert of_bytes(data, "crc32") == f"crc32:{zlib.crc32(data):08x}"


def test_the_algorithm_of_a_stored_checksum():
    assert algorithm_of(of_bytes(b"x")) == "xxh3" and algorithm_of("crc32:0000abcd") == "crc32"
    assert algorithm_of("sha999:00") is None  # unknown: the caller checks the size only
