"""Checksums, taken as the bytes are written or uploaded and checked as they are read (principle 2).

xxh3 (64 bit, the `xxhash` package, which `datasets` already depends on), chosen over zlib's crc32 for its
speed: crc32's cost was most of the gap between a checkpoint write and a plain write of the same bytes
(`benchmarks/checkpoint.py`; the figures are in benchmarks/README.md). It guards against storage damage (bit
rot, a torn or truncated upload, a stray overwrite), not against an adversary. A checksum is stored as
"<algorithm>:<hex digits>"; one taken with "crc32:..." still verifies, with the algorithm it names.

What a checksum is compared with (a checkpoint's manifest) is the checkpoint package's: checkpoint/damage.py.
"""

from __future__ import annotations

import zlib
from typing import Optional

try:
    import xxhash
    ALGORITHM = "xxh3"
except ImportError:  # pragma: no cover (datasets requires xxhash); checkpoints stay verifiable either way
    xxhash = None
    ALGORITHM = "crc32"
KNOWN = ("xxh3", "crc32")
CHUNK = 8 << 20  # bytes per read when streaming a file: memory stays flat for any checkpoint size


def algorithm_of(expected: str) -> Optional[str]:
    """The algorithm a stored checksum was taken with; None for one this version cannot compute."""
    name = expected.split(":", 1)[0]
    return name if name in KNOWN and (name != "xxh3" or xxhash is not None) else None


class Checksum:
    """A running checksum, fed chunk by chunk as a file is written or read."""

    def __init__(self, algorithm: str = ALGORITHM):
        self.algorithm = algorithm
        self._xxh = xxhash.xxh3_64() if algorithm == "xxh3" else None
        self.value = 0  # crc32's running value
        self.size = 0

    def update(self, data) -> None:
        if self._xxh is not None:
            self._xxh.update(data)
        else:
            self.value = zlib.crc32(data, self.value)
        self.size += len(data)

    def hexdigest(self) -> str:
        if self._xxh is not None:
            return f"xxh3:{self._xxh.hexdigest()}"
        return f"crc32:{self.value:08x}"


def of_bytes(data: bytes, algorithm: str = ALGORITHM) -> str:
    checksum = Checksum(algorithm)
    checksum.update(data)
    return checksum.hexdigest()


def of_stream(stream, algorithm: str = ALGORITHM) -> Checksum:
    """Checksum of what is left in a binary file object, read in chunks."""
    checksum = Checksum(algorithm)
    while True:
        chunk = stream.read(CHUNK)
        if not chunk:
            return checksum
        checksum.update(chunk)


def of_local_file(path: str) -> str:
    """For files a library writes itself (save_pretrained, safetensors): read back once, from the page cache."""
    with open(path, "rb") as f:
        return of_stream(f).hexdigest()


class HashingFile:
    """A write-only file object that checksums what passes through it (torch.save accepts any object with
    `write`), so a file's checksum costs no second read."""

    def __init__(self, raw):
        self.raw = raw
        self.checksum = Checksum()

    def write(self, data) -> int:
        self.checksum.update(data)
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()
