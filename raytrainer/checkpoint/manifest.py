"""The commit marker: a checkpoint exists only once its manifest is written (principle 2).

Object stores have no rename, so a checkpoint cannot appear atomically; instead every file is written
first and `COMMITTED` last. The manifest lists each file with its size and checksum (format 2; format 1
had sizes only and still loads): a listing tells a committed checkpoint whose files were later truncated or
lost from a sound one, and a reader verifies the bytes it loads (damage.py, with storage/integrity.py's checksums).

A checkpoint with a valid manifest was committed once, whatever happened to its files since: it is never
treated as partial (never cleaned up as a failed write), only reported as damaged.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from ..storage import exists, get_fs, join, read_text, remove, write_text
from ..storage.integrity import of_stream

MANIFEST_NAME = "COMMITTED"
FORMAT = 2  # 2: a "checksums" map beside the sizes


def list_files(ckpt_url: str, storage_options: dict | None = None) -> dict[str, int]:
    """Every file under `ckpt_url` (recursively, manifest excluded) as {relative posix path: size}."""
    fs, path = get_fs(ckpt_url, storage_options)
    root = path.rstrip("/") + "/"
    try:
        found = fs.find(path, detail=True)
    except FileNotFoundError:
        return {}
    files = {}
    for name, info in found.items():
        relative = name[len(root):] if name.startswith(root) else None
        if relative and relative != MANIFEST_NAME:
            files[relative] = int(info["size"])
    return files


def commit(ckpt_url: str, step: int, storage_options: dict | None = None,
           files: dict[str, int] | None = None, checksums: dict[str, str] | None = None,
           written_by: dict | None = None) -> dict:
    """Write the manifest for a fully written checkpoint; returns it.

    `files` lets the writer pass what it wrote (no listing needed); otherwise the directory is listed.
    `checksums` ({relative path: "xxh3:..."}) are those the writer took as it wrote; every file should have one.
    Call only after every file is durably written (and, with several writers, after all of them finished).
    `written_by`: who wrote it, when not raytrainer's own loop (the hosted mode: {"trainer": class, "index": n}).
    """
    if files is None:
        files = list_files(ckpt_url, storage_options)
    if checksums is None:  # a caller that did not take them as it wrote: read every file back once
        checksums = {name: _checksum(join(ckpt_url, name), storage_options) for name in files}
    manifest = {
        "format": FORMAT,
        "step": int(step),
        "created": datetime.now(timezone.utc).isoformat(),
        "files": {str(name): int(size) for name, size in sorted(files.items())},
        "checksums": {str(name): str(value) for name, value in sorted(checksums.items())},
    }
    if written_by:
        manifest["written_by"] = dict(written_by)
    write_text(join(ckpt_url, MANIFEST_NAME), json.dumps(manifest, indent=1), storage_options)
    return manifest


def _checksum(url: str, storage_options: dict | None) -> str:
    fs, path = get_fs(url, storage_options)
    with fs.open(path, "rb") as f:
        return of_stream(f).hexdigest()


def read_manifest(ckpt_url: str, storage_options: dict | None = None) -> dict | None:
    """The manifest, or None when it is absent or not a valid one (e.g. torn by a crash mid-write).

    Other errors (unreachable storage, denied access) propagate: treating them as "not committed" would let
    cleanup delete a good checkpoint.
    """
    try:
        manifest = json.loads(read_text(join(ckpt_url, MANIFEST_NAME), storage_options))
    except (FileNotFoundError, IsADirectoryError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    valid = (isinstance(manifest, dict) and isinstance(manifest.get("format"), int)
             and isinstance(manifest.get("step"), int) and isinstance(manifest.get("files"), dict)
             and all(isinstance(size, int) for size in manifest["files"].values())
             and isinstance(manifest.get("checksums", {}), dict)
             and all(isinstance(value, str) for value in manifest.get("checksums", {}).values()))
    return manifest if valid else None


def commit_order(manifest: dict, step: int) -> tuple:
    """Sort key of committed checkpoints by when they were committed (the manifest's `created`, UTC ISO, then the
    step): a run started afresh commits lower steps after a longer earlier run's (choice.py, retention.py)."""
    return str(manifest.get("created", "")), step


def files_match(manifest: dict, files: dict[str, int]) -> bool:
    """Every file the manifest lists is present with its listed size (extra files are allowed)."""
    return size_problem(manifest, files) is None


def size_problem(manifest: dict, files: dict[str, int]) -> tuple[str, str] | None:
    """(file, what is wrong) for the first listed file that is missing or has another size; None if all match."""
    for name, size in sorted(manifest["files"].items()):
        found = files.get(name)
        if found is None:
            return name, "missing (it was committed)"
        if found != size:
            return name, f"{found} bytes, but {size} were committed (truncated or overwritten)"
    return None


def is_committed(ckpt_url: str, storage_options: dict | None = None, verify: bool = True) -> bool:
    manifest = read_manifest(ckpt_url, storage_options)
    if manifest is None:
        return False
    return not verify or files_match(manifest, list_files(ckpt_url, storage_options))


def uncommit(ckpt_url: str, storage_options: dict | None = None) -> None:
    """Remove the manifest, if there is one: the checkpoint is partial from now on (before it is deleted, or
    written over)."""
    if exists(join(ckpt_url, MANIFEST_NAME), storage_options):
        remove(join(ckpt_url, MANIFEST_NAME), recursive=False, storage_options=storage_options)


def delete(ckpt_url: str, storage_options: dict | None = None) -> None:
    """Delete a checkpoint, un-committing it first: an interrupted delete leaves a partial checkpoint,
    never a committed one with files missing."""
    remove(join(ckpt_url, MANIFEST_NAME), recursive=False, storage_options=storage_options)
    remove(ckpt_url, storage_options=storage_options)
