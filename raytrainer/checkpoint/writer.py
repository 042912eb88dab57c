"""Writes a captured checkpoint to storage and commits it, in the background or synchronously.

Order (principle 2): all files first, the commit marker (manifest) last, then retention. Local storage is
written in place (the directory does not count until committed); remote storage is written to a local
staging directory and uploaded, since save_pretrained and torch.save want a local path.
Only one write is in flight: the next save, and the end of training, wait for the previous commit.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from typing import Callable, Optional

from . import manifest, retention
from .snapshot import Snapshot
from .storage import exists, get_fs, is_local, join, local_path


def write_snapshot(snapshot: Snapshot, ckpt_url: str, save_model: Callable[[str, dict], None],
                   storage_options: Optional[dict] = None, written: Optional[dict] = None) -> dict:
    """Write every file of `snapshot` under `ckpt_url`, then commit. Returns the manifest.

    `written`: files already under `ckpt_url` ({relative path: size}, e.g. every rank's FSDP shards), listed
    in the manifest with ours; without it, a leftover directory of the same step is deleted first."""
    if written is None and exists(ckpt_url, storage_options):  # a leftover of the same step: un-commit it
        manifest.delete(ckpt_url, storage_options)
    staging = local_path(ckpt_url) if is_local(ckpt_url) else tempfile.mkdtemp(prefix="raytrainer-ckpt-")
    try:
        os.makedirs(staging, exist_ok=True)
        save_model(staging, snapshot.model_state)
        snapshot.write_state_files(staging)
        files = {**(written or {}), **_sizes(staging)}
        if not is_local(ckpt_url):
            fs, path = get_fs(ckpt_url, storage_options)
            fs.put(staging.rstrip("/") + "/", path, recursive=True)
        return manifest.commit(ckpt_url, snapshot.step, storage_options, files=files)
    finally:
        if not is_local(ckpt_url):
            shutil.rmtree(staging, ignore_errors=True)


def _sizes(root: str) -> dict:
    sizes = {}
    for directory, _, names in os.walk(root):
        for name in names:
            full = os.path.join(directory, name)
            sizes[os.path.relpath(full, root)] = os.path.getsize(full)
    return sizes


class CheckpointWriter:
    """Runs one checkpoint write at a time, in a background thread (async) or inline."""

    def __init__(self, output_dir: str, storage_options: Optional[dict], save_async: bool,
                 save_total_limit: Optional[int], on_commit: Callable[[int, str], None]):
        self.output_dir = output_dir
        self.storage_options = storage_options
        self.save_async = save_async
        self.save_total_limit = save_total_limit
        self.on_commit = on_commit
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None

    def submit(self, snapshot: Snapshot, save_model: Callable[[str, dict], None], best_url: Optional[str],
               written: Optional[dict] = None):
        self.wait()
        ckpt_url = join(self.output_dir, f"checkpoint-{snapshot.step}")
        job = lambda: self._write(snapshot, ckpt_url, save_model, best_url, written)  # noqa: E731
        if not self.save_async:
            return job()
        self._thread = threading.Thread(target=self._guarded, args=(job,), name="raytrainer-ckpt", daemon=True)
        self._thread.start()

    def _guarded(self, job):
        try:
            job()
        except BaseException as exc:  # surfaced in the training thread at the next wait()
            self._error = exc

    def _write(self, snapshot, ckpt_url, save_model, best_url, written=None):
        write_snapshot(snapshot, ckpt_url, save_model, self.storage_options, written)
        retention.rotate(self.output_dir, self.save_total_limit, best_url, self.storage_options)
        self.on_commit(snapshot.step, ckpt_url)

    def wait(self):
        """Block until the write in flight is committed; re-raise its error here, in the training thread."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise RuntimeError(f"Writing a checkpoint under {self.output_dir} failed: {error}") from error
