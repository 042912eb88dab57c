"""Checksums of checkpoint files: taken as the bytes are written, checked as they are read (principle 2).

xxh3 (64 bit, the `xxhash` package, which `datasets` already depends on): about 6.6 GB/s on one core here,
8x zlib's crc32 (0.8 GB/s), whose cost was most of the gap between a checkpoint write and a plain write of
the same bytes (benchmarks/checkpoint.py). It guards against storage damage (bit rot, a torn or truncated
upload, a stray overwrite), not against an adversary. A checksum is stored as "<algorithm>:<hex digits>";
manifests written with "crc32:..." still verify, each file with the algorithm its manifest names.
"""

from __future__ import annotations

import contextlib
import zlib
from typing import Optional

from ..errors import StorageError

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


class CheckpointDamagedError(StorageError):
    """A committed checkpoint whose files no longer match its manifest, or cannot be parsed. Retrying cannot
    help: the run fails once (`fatal`), and the checkpoint is left in place as evidence."""

    fatal = True

    def __init__(self, ckpt_url: str, name: str, problem: str, hint: Optional[str] = None):
        self.ckpt_url, self.name, self.problem, self.hint = ckpt_url, name, problem, hint
        hint = hint or ("It is left in place, unchanged. Resume from an older checkpoint (a path, or "
                        "resume_from_checkpoint=True, which falls back to the newest intact one), or restore the "
                        "file from a copy.")
        super().__init__(f"Checkpoint {ckpt_url} is damaged: {name}: {problem}. {hint}")

    def __reduce__(self):  # raised on a worker, unpickled on the driver: rebuilt from the same arguments
        return type(self), (self.ckpt_url, self.name, self.problem, self.hint)


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


def check_bytes(ckpt_url: str, name: str, data: bytes, manifest: Optional[dict]) -> None:
    """Raise `CheckpointDamagedError` when `data`, read from `name`, differs from what the manifest recorded.
    A manifest without checksums (written before they existed) is checked by size only."""
    if manifest is None:
        return
    expected_size = manifest["files"].get(name)
    if expected_size is not None and expected_size != len(data):
        raise CheckpointDamagedError(ckpt_url, name, f"{len(data)} bytes, but {expected_size} were committed")
    expected = (manifest.get("checksums") or {}).get(name)
    algorithm = algorithm_of(expected) if expected is not None else None
    if algorithm is not None and of_bytes(data, algorithm) != expected:
        raise CheckpointDamagedError(ckpt_url, name, f"its content changed since it was committed (checksum "
                                     f"{of_bytes(data, algorithm)}, committed {expected})")


@contextlib.contextmanager
def parsing(ckpt_url: str, name: str):
    """Name the file and the checkpoint when a file cannot be parsed (a damaged header in a checkpoint without
    checksums gives `SafetensorError: header too large`, `UnpicklingError`, `JSONDecodeError`...)."""
    try:
        yield
    except CheckpointDamagedError:
        raise
    except (FileNotFoundError, PermissionError, ConnectionError, TimeoutError):
        raise  # storage problems, not damage: described elsewhere
    except Exception as exc:  # noqa: BLE001 (every parser has its own error types)
        raise CheckpointDamagedError(ckpt_url, name, f"cannot be read ({type(exc).__name__}: {exc})") from exc
