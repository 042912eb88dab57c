"""Writes a captured checkpoint to storage and commits it, in the background or synchronously.

Order (principle 2): all files first, the commit marker (manifest, with each file's size and checksum)
last, then retention. Local storage is written in place (the directory does not count until committed);
remote storage is written to a local staging directory and uploaded file by file (`storage/upload.py`: never
creating a bucket), since save_pretrained and torch.save want a local path. Checksums are taken as the
bytes are written or uploaded; only model files a library writes itself on local disk are read back once.
Before writing and again before committing, the run's lease is checked (`guard`): a run whose storage
lost its data, or whose output_dir another run took over, stops instead of committing.
Only one write is in flight: the next save, and the end of training, wait for the previous commit.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from typing import Callable, Optional

from ..storage import basename, exists, get_fs, is_local, join, local_path
from ..storage.errors import StorageFatalError, StorageLostError, fatal_error
from ..storage.integrity import of_local_file
from ..storage.retry import Retry
from ..storage.upload import local_files, upload_dir
from . import manifest, retention
from .damage import verify
from .listing import checkpoint_name
from .snapshot import Snapshot


def write_snapshot(snapshot: Snapshot, ckpt_url: str, save_model: Callable[[str, dict], None],
                   storage_options: Optional[dict] = None, written: Optional[dict] = None,
                   retry: Optional[Retry] = None, checksums: Optional[dict] = None,
                   guard: Optional[Callable[[], None]] = None) -> dict:
    """Write every file of `snapshot` under `ckpt_url`, then commit. Returns the manifest.

    `written`: files already under `ckpt_url` ({relative path: size}, e.g. every rank's FSDP shards) and
    their `checksums`, listed in the manifest with ours; without it, a leftover directory of the same step
    is cleared first (`clear_leftover`). `guard` runs before writing and again right before the commit."""
    retry = retry or Retry(storage_options=storage_options)
    if guard is not None:
        guard()
    if written is None:
        clear_leftover(ckpt_url, storage_options, retry)
    local = is_local(ckpt_url)
    staging = local_path(ckpt_url) if local else tempfile.mkdtemp(prefix="raytrainer-ckpt-")
    try:
        try:
            os.makedirs(staging, exist_ok=True)
            save_model(staging, snapshot.model_state)
            sums = snapshot.write_state_files(staging)
        except Exception as exc:  # a full or read-only disk (local output_dir, or the staging directory)
            fatal = fatal_error(exc, ckpt_url if local else staging, f"writing {basename(ckpt_url)}")
            if fatal is not None:
                raise fatal from exc
            raise
        files = {**(written or {}), **_sizes(staging)}
        if local:  # files save_pretrained/safetensors wrote themselves: read back once, from the page cache
            sums.update({name: of_local_file(os.path.join(staging, name)) for name in local_files(staging)
                         if name not in sums})
        else:
            sums = upload_dir(staging, ckpt_url, storage_options, retry)  # checksummed as uploaded
        if guard is not None:
            guard()
        return retry.call(lambda: manifest.commit(ckpt_url, snapshot.step, storage_options, files=files,
                                                  checksums={**(checksums or {}), **sums}),
                          ckpt_url, "committing")
    finally:
        if not local:
            shutil.rmtree(staging, ignore_errors=True)


def clear_leftover(ckpt_url: str, storage_options: Optional[dict], retry: Retry) -> None:
    """Make room for a new checkpoint of the same step. A partial leftover (a write that never committed) is
    deleted. A committed one is only replaced when intact, checksums included (a new run in the same output_dir
    overwrites its predecessor's checkpoint-N, as Hugging Face's Trainer does); a damaged one (its run fell back
    to an older checkpoint) is set aside as `checkpoint-N.damaged`, never deleted: it is the evidence of what
    went wrong, maybe the only copy of its step."""
    if not retry.call(lambda: exists(ckpt_url, storage_options), ckpt_url, "checking for a leftover"):
        return
    if set_aside_if_damaged(ckpt_url, storage_options, retry) is None:
        retry.call(lambda: manifest.delete(ckpt_url, storage_options), ckpt_url, "removing a leftover")


def set_aside_if_damaged(ckpt_url: str, storage_options: Optional[dict], retry: Retry) -> Optional[str]:
    """A committed checkpoint whose files no longer match its manifest is moved to `checkpoint-N.damaged` (or
    `.damaged-2`, ...) before a new save of its step: the URL it went to, or None where there was nothing
    damaged there (no checkpoint, a partial one, an intact one)."""
    committed = manifest.read_manifest(ckpt_url, storage_options)
    if committed is None or verify(ckpt_url, storage_options, committed) is None:
        return None
    aside = _free_name(ckpt_url + ".damaged", storage_options)
    retry.call(lambda: _move(ckpt_url, aside, storage_options), ckpt_url, "setting a damaged checkpoint aside")
    return aside


def _move(src: str, dst: str, storage_options: Optional[dict]) -> None:
    """Local: one rename. Object stores (no rename): copy every object, then delete the originals (the commit
    marker first, as any delete), so an interruption leaves a full copy and at most a partial original."""
    if is_local(src):
        os.rename(local_path(src), local_path(dst))
        return
    fs, path = get_fs(src, storage_options)
    target = get_fs(dst, storage_options)[1]
    for name in manifest.list_files(src, storage_options) | {manifest.MANIFEST_NAME: 0}:
        fs.copy(f"{path.rstrip('/')}/{name}", f"{target.rstrip('/')}/{name}")
    manifest.delete(src, storage_options)


def _free_name(url: str, storage_options: Optional[dict]) -> str:
    candidate, n = url, 1
    while exists(candidate, storage_options):
        n += 1
        candidate = f"{url}-{n}"
    return candidate


def _sizes(root: str) -> dict:
    return {name: os.path.getsize(os.path.join(root, name)) for name in local_files(root)}


class CheckpointWriter:
    """Runs one checkpoint write at a time, in a background thread (async) or inline."""

    def __init__(self, output_dir: str, storage_options: Optional[dict], save_async: bool,
                 save_total_limit: Optional[int], on_commit: Callable[[int, str], None],
                 retry: Optional[Retry] = None, guard: Optional[Callable[[], None]] = None):
        self.output_dir = output_dir
        self.storage_options = storage_options
        self.save_async = save_async
        self.save_total_limit = save_total_limit
        self.on_commit = on_commit
        self.retry = retry or Retry(storage_options=storage_options)
        self.guard = guard
        self.last_url: Optional[str] = None  # the newest checkpoint this writer committed
        self._thread: Optional[threading.Thread] = None
        self._error: Optional[BaseException] = None

    def submit(self, snapshot: Snapshot, save_model: Callable[[str, dict], None], best_url: Optional[str],
               written: Optional[dict] = None, checksums: Optional[dict] = None,
               shards: Optional[Callable[[], tuple]] = None):
        """`shards` (FSDP shards written in the background): run first in the job, it waits until every rank's
        shard files are written and returns them as (written, checksums); only then are ours written and the
        checkpoint committed."""
        ckpt_url = join(self.output_dir, checkpoint_name(snapshot.step))

        def job():
            files, sums = shards() if shards is not None else (written, checksums)
            self._write(snapshot, ckpt_url, save_model, best_url, files, sums)

        self.run(job)

    def run(self, job: Callable[[], object]):
        """Run `job` after the previous one: in the background thread, or inline when not save_async."""
        self.wait()
        if not self.save_async:
            return job()
        self._thread = threading.Thread(target=self._guarded, args=(job,), name="raytrainer-ckpt", daemon=True)
        self._thread.start()

    def _guarded(self, job):
        try:
            job()
        except BaseException as exc:  # surfaced in the training thread at the next wait()
            self._error = exc

    def _write(self, snapshot, ckpt_url, save_model, best_url, written=None, checksums=None):
        write_snapshot(snapshot, ckpt_url, save_model, self.storage_options, written, self.retry, checksums,
                       guard=self._check_storage)
        self.last_url = ckpt_url
        self.retry.call(lambda: retention.rotate(self.output_dir, self.save_total_limit, best_url,
                                                 self.storage_options), self.output_dir, "applying save_total_limit")
        self.on_commit(snapshot.step, ckpt_url)

    def _check_storage(self):
        """The lease is still ours, and the checkpoint this writer committed last is still there."""
        if self.guard is not None:
            self.guard()
        last = self.last_url  # retention never deletes the newest checkpoint: it must still be there
        if last is not None and self.retry.call(lambda: manifest.read_manifest(last, self.storage_options),
                                                last, "checking the previous checkpoint") is None:
            raise StorageLostError(f"{last}, committed by this run, is gone from storage: the storage lost this "
                                   "run's checkpoints. The run stops instead of writing on as if nothing happened; "
                                   "restore the data, or start a new run.")

    def wait(self):
        """Block until the write in flight is committed; re-raise its error here, in the training thread."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            if isinstance(error, StorageFatalError) or getattr(error, "fatal", False):
                raise error  # already names the checkpoint and the fix; keeps its type (not retried)
            raise RuntimeError(f"Writing a checkpoint under {self.output_dir} failed: {error}") from error
