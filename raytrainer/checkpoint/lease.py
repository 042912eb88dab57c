"""One writer per output_dir (principle 2): a run holds a lease object under output_dir while it trains.

The lease is a small JSON object: the run id, the driver's host and pid, and a heartbeat the driver
refreshes every `HEARTBEAT_S`. It is taken with the storage's conditional write where there is one (S3:
`If-None-Match: *` to create, `If-Match: <etag>` to take over or refresh; local disk: a hard link, which
fails when the name exists), so two drivers starting together cannot both win.

A second driver is refused before any actor starts, naming the holder. A stale lease is taken over with a
message: no heartbeat for `stale_after_s()`, or its driver's process is gone from this host.

The lease is also the run's canary on storage: a worker finding it missing knows the storage lost what the
run wrote (emptied, or re-created), and stops instead of restarting from step 0; finding another run's
lease, it knows it was taken over and must not commit.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Optional

from ..errors import StorageError
from ..storage import get_fs, is_local, is_object_store, join, local_path
from ..storage.errors import StorageFatalError, StorageLostError, bucket_lost, precondition_failed
from ..storage.retry import Retry
from ..verbosity import notice

LEASE_NAME = ".raytrainer-lease.json"
HEARTBEAT_S = 10.0
STALE_ENV = "RAYTRAINER_LEASE_STALE_S"
DEFAULT_STALE_S = 60.0
_HELD: set = set()  # run ids whose lease this process holds now (a same-pid lease not among them is left over)


class LeaseHeldError(StorageError):
    """Another live run writes this output_dir. Raised on the driver, before any actor starts."""


class LeaseLostError(StorageFatalError):
    """This run's lease was taken over by another run: it must stop writing."""


def stale_after_s() -> float:
    return float(os.environ.get(STALE_ENV, DEFAULT_STALE_S))


def lease_url(output_dir: str) -> str:
    return join(output_dir, LEASE_NAME)


def _record(run_id: str) -> dict:
    now = time.time()
    return {"run_id": run_id, "host": socket.gethostname(), "pid": os.getpid(), "started": now, "heartbeat": now}


def describe(record: dict) -> str:
    age = time.time() - float(record.get("heartbeat", 0))
    return (f"run {record.get('run_id')!r} (driver pid {record.get('pid')} on host {record.get('host')!r}, last "
            f"heartbeat {age:.0f} s ago)")


def _stale_reason(record: dict) -> Optional[str]:
    age = time.time() - float(record.get("heartbeat", 0))
    if age > stale_after_s():
        return f"no heartbeat for {age:.0f} s (stale after {stale_after_s():g} s)"
    if record.get("host") == socket.gethostname() and isinstance(record.get("pid"), int):
        if record["pid"] == os.getpid():
            return None if record.get("run_id") in _HELD else "left by an earlier run of this process"
        try:
            os.kill(record["pid"], 0)
        except ProcessLookupError:
            return f"its driver (pid {record['pid']}) is no longer running"
        except PermissionError:  # alive, another user's
            pass
    return None


# ------------------------------------------------------------------------------ storage primitives
class _Store:
    """Create-if-absent, read with a version token, replace-if-unchanged and delete, on local disk or an
    object store."""

    def __init__(self, output_dir: str, storage_options: Optional[dict]):
        self.url = lease_url(output_dir)
        self.fs, self.path = get_fs(self.url, storage_options)
        self.local = is_local(self.url)

    def read(self) -> tuple[Optional[dict], Optional[str]]:
        """(record, version token) or (None, None) when absent. A torn or foreign file reads as stale."""
        try:
            if self.local:
                with open(local_path(self.url), "rb") as f:
                    data = f.read()
                token = data.decode("utf-8", "replace")
            else:
                info = self.fs.info(self.path)
                data = self.fs.cat_file(self.path)
                token = str(info.get("ETag") or info.get("etag") or data.decode("utf-8", "replace"))
        except FileNotFoundError:
            return None, None
        try:
            record = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError):
            record = None
        return (record if isinstance(record, dict) else {"heartbeat": 0}), token

    def create(self, record: dict) -> bool:
        """Write the lease if none exists; False when one does."""
        data = json.dumps(record).encode()
        if self.local:
            path = local_path(self.url)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{uuid.uuid4().hex}.tmp"
            with open(tmp, "wb") as f:
                f.write(data)
            try:
                os.link(tmp, path)  # atomic, and fails if the name exists: the whole record or nothing
                return True
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
        if is_object_store(self.fs):
            try:
                self.fs.pipe_file(self.path, data, mode="create")
                return True
            except (FileExistsError, OSError) as exc:
                if precondition_failed(exc):
                    return False
                raise
        if self.fs.exists(self.path):  # no conditional write on this filesystem: check, then write
            return False
        self.fs.pipe_file(self.path, data)
        return True

    def replace(self, token: str, record: dict) -> bool:
        """Overwrite the lease only if it is still the version read as `token`; False when it changed."""
        data = json.dumps(record).encode()
        if self.local:
            path = local_path(self.url)
            aside = f"{path}.{uuid.uuid4().hex}.old"
            try:
                os.rename(path, aside)  # only one of several takers can move the old lease away
            except FileNotFoundError:
                return False
            with open(aside, "rb") as f:
                unchanged = f.read().decode("utf-8", "replace") == token
            if not unchanged:  # refreshed meanwhile: put it back, unless someone created one since
                try:
                    os.link(aside, path)
                except FileExistsError:
                    pass
                os.unlink(aside)
                return False
            os.unlink(aside)
            return self.create(record)
        if is_object_store(self.fs):
            try:
                self.fs.pipe_file(self.path, data, IfMatch=token)
                return True
            except (FileNotFoundError, OSError) as exc:
                if isinstance(exc, FileNotFoundError) or precondition_failed(exc):
                    return False
                raise
        self.fs.pipe_file(self.path, data)
        return True

    def refresh(self, token: str, record: dict) -> bool:
        """The holder's heartbeat: overwrite in one step (a reader must never find the lease missing)."""
        if not self.local:
            return self.replace(token, record)
        path = local_path(self.url)
        tmp = f"{path}.{uuid.uuid4().hex}.tmp"
        with open(tmp, "wb") as f:
            f.write(json.dumps(record).encode())
        os.replace(tmp, path)
        return True

    def delete(self) -> None:
        try:
            self.fs.rm_file(self.path)
        except FileNotFoundError:
            pass


# --------------------------------------------------------------------------------------- the lease
@dataclass
class Lease:
    output_dir: str
    run_id: str
    storage_options: Optional[dict]
    lost: Optional[str] = None  # why the heartbeat stopped (taken over, storage lost)

    def __post_init__(self):
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        _HELD.add(self.run_id)

    def start_heartbeat(self, interval_s: float = HEARTBEAT_S):
        self._thread = threading.Thread(target=self._beat, args=(interval_s,), name="raytrainer-lease",
                                        daemon=True)
        self._thread.start()

    def _beat(self, interval_s: float):
        store = _Store(self.output_dir, self.storage_options)
        while not self._stop.wait(interval_s):
            try:
                record, token = store.read()
                if record is None or record.get("run_id") != self.run_id:
                    self.lost = ("the lease is gone: the storage lost its data" if record is None else
                                 f"taken over by {describe(record)}")
                    notice(f"output_dir {self.output_dir}: this run's lease was lost ({self.lost}); the "
                            "workers stop at their next checkpoint commit")
                    return
                store.refresh(token, {**record, "heartbeat": time.time()})
            except Exception as exc:  # noqa: BLE001 (an outage: the next beat tries again, before it goes stale)
                notice(f"could not refresh the lease under {self.output_dir} ({type(exc).__name__}); retrying")

    def release(self):
        """Stop the heartbeat and delete the lease if it is still ours."""
        self._stop.set()
        _HELD.discard(self.run_id)
        if self._thread is not None:
            self._thread.join(timeout=30)
        store = _Store(self.output_dir, self.storage_options)
        try:
            record, _ = store.read()
            if record is not None and record.get("run_id") == self.run_id:
                store.delete()
        except Exception as exc:  # noqa: BLE001 (a lease left behind goes stale; the run's result stands)
            notice(f"could not release the lease under {self.output_dir} ({type(exc).__name__}): the next run "
                    f"takes it over once stale")

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, *exc) -> bool:
        self.release()
        return False


def acquire(output_dir: str, run_id: str, storage_options: Optional[dict] = None,
            retry: Optional[Retry] = None, heartbeat: bool = True) -> Lease:
    """Take the lease of `output_dir` for `run_id`, or raise `LeaseHeldError` naming the live holder."""
    retry = retry or Retry(storage_options=storage_options)
    store = _Store(output_dir, storage_options)
    for _ in range(5):  # a lease can vanish or change between our read and our write: look again
        if retry.call(lambda: store.create(_record(run_id)), store.url, "taking the run's lease"):
            return _started(Lease(output_dir, run_id, storage_options), heartbeat)
        record, token = retry.call(store.read, store.url, "reading the run's lease")
        if record is None:
            continue
        why = _stale_reason(record)
        if why is None:
            raise LeaseHeldError(
                f"output_dir={output_dir!r} is being written by another run: {describe(record)}. Two runs "
                "writing one output_dir would replace each other's checkpoints. Wait for it to finish, stop it, "
                f"or choose another output_dir (a lease without a heartbeat for {stale_after_s():g} s is taken "
                f"over; {STALE_ENV} changes that).")
        take_over = lambda token=token: store.replace(token, _record(run_id))  # noqa: E731 (binds this token)
        if retry.call(take_over, store.url, "taking over a stale lease"):
            if "earlier run of this process" not in why:
                notice(f"took over output_dir {output_dir} from {describe(record)}: {why}")
            return _started(Lease(output_dir, run_id, storage_options), heartbeat)
    raise LeaseHeldError(f"Could not take the lease of output_dir={output_dir!r}: other drivers keep taking it. "
                         "Run one driver per output_dir.")


def _started(lease: Lease, heartbeat: bool) -> Lease:
    if heartbeat:
        lease.start_heartbeat()
    return lease


def live_holder(output_dir: str, storage_options: Optional[dict] = None) -> Optional[dict]:
    """The lease record of the run writing output_dir now, or None (no lease, or a stale one)."""
    record, _ = _Store(output_dir, storage_options).read()
    return record if record is not None and _stale_reason(record) is None else None


def check_held(output_dir: str, run_id: str, storage_options: Optional[dict] = None,
               retry: Optional[Retry] = None) -> None:
    """On a worker, before resuming and before each commit: the lease must still be this run's."""
    retry = retry or Retry(storage_options=storage_options)
    store = _Store(output_dir, storage_options)
    record, _ = retry.call(store.read, store.url, "checking the run's lease")
    if record is None and is_object_store(store.fs):
        bucket = store.path.split("/", 1)[0]
        if not retry.call(lambda: store.fs.exists(bucket), store.url, "checking the bucket"):
            raise bucket_lost(store.url, "checking the run's lease")
    if record is None:
        raise StorageLostError(
            f"This run's lease under output_dir={output_dir!r} is gone: the storage lost what this run wrote "
            "(emptied, re-created, or output_dir is not the same storage on every node). The run stops instead "
            "of starting again from step 0 and overwriting nothing it can no longer see. Restore the data, or "
            "start a new run.")
    if record.get("run_id") != run_id:
        raise LeaseLostError(f"output_dir={output_dir!r} was taken over by {describe(record)} (this run's driver "
                             "missed its heartbeats): this run stops without committing, so the two runs do not "
                             "replace each other's checkpoints.")


