"""Damaged checkpoints (principle 2): a committed checkpoint whose files no longer match its manifest, or cannot
be parsed, is *damaged*. Found here, it is named (the checkpoint, the file, what is wrong) and never loaded.

- `verify`: the damage found in a whole committed checkpoint (sizes from one listing, then every checksum).
- `check_bytes`: one file's bytes, as they are loaded, against the manifest's size and checksum.
- `parsing`: a file that cannot be parsed (a damaged header in a checkpoint without checksums) named as damage.

The checksums themselves are storage's (storage/integrity.py); the manifest they are compared with is
manifest.py's. A damaged checkpoint is never deleted: it stays as evidence (listing.remove_partial, resume.py).
"""

from __future__ import annotations

import contextlib
from typing import Optional

from ..errors import StorageError
from ..storage import get_fs, join
from ..storage.integrity import algorithm_of, of_bytes, of_stream
from .manifest import MANIFEST_NAME, list_files, read_manifest, size_problem


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


def verify(ckpt_url: str, storage_options: Optional[dict] = None, manifest: Optional[dict] = None,
           full: bool = True) -> Optional[CheckpointDamagedError]:
    """The damage found in a committed checkpoint, or None when intact. Sizes come from one listing; with
    `full`, every file with a recorded checksum is read (streamed) and checked. A manifest written before
    checksums existed is checked by size only."""
    manifest = manifest or read_manifest(ckpt_url, storage_options)
    if manifest is None:
        return CheckpointDamagedError(ckpt_url, MANIFEST_NAME, "missing or unreadable")
    problem = size_problem(manifest, list_files(ckpt_url, storage_options))
    if problem is not None:
        return CheckpointDamagedError(ckpt_url, *problem)
    if not full:
        return None
    for name, expected in sorted((manifest.get("checksums") or {}).items()):
        algorithm = algorithm_of(expected)
        if algorithm is None:  # taken with an algorithm this version does not know: sizes were checked
            continue
        fs, path = get_fs(join(ckpt_url, name), storage_options)
        with fs.open(path, "rb") as f:
            found = of_stream(f, algorithm).hexdigest()
        if found != expected:
            return CheckpointDamagedError(ckpt_url, name, f"its content changed since it was committed (checksum "
                                          f"{found}, committed {expected})")
    return None


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
