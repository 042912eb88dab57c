"""Storage that fails (issue 20, 4): the writer never creates a bucket; lost storage stops the run with a clear
error; a transient outage is ridden out for `storage_retry_timeout_s`; a full or read-only disk fails at once
with the fix. Real faults: a bucket deleted on moto, a proxy that cuts the endpoint, a 2 MB tmpfs."""

from __future__ import annotations

import json
import threading
import time

import pytest

from raytrainer import storage
from raytrainer.checkpoint import lease, manifest
from raytrainer.checkpoint.damage import verify
from raytrainer.checkpoint.model_io import save_model_files
from raytrainer.checkpoint.snapshot import Snapshot, get_rng_state
from raytrainer.checkpoint.writer import CheckpointWriter, write_snapshot
from raytrainer.errors import StorageError
from raytrainer.storage.errors import StorageFatalError, StorageLostError
from raytrainer.storage.retry import Retry
from tests.models import make_model
from tests.storage.faults import OutageProxy, bucket_exists, delete_bucket, empty_bucket, small_disk


def _snapshot(step: int, extra_bytes: int = 0):
    model = make_model(step)
    snapshot = Snapshot(step=step, model_state=model.state_dict(), model=model,
                        optimizer_state={"pad": b"x" * extra_bytes}, scheduler_state={"last_epoch": step},
                        rng_states=[get_rng_state()], trainer_state_json=json.dumps({"global_step": step}),
                        args_json="{}")
    return snapshot, (lambda d, sd: save_model_files(model, d, sd))


def test_vanished_bucket_is_never_recreated(s3_server, s3_bucket):
    opts = s3_server.storage_options
    delete_bucket(opts, s3_bucket)
    snapshot, save = _snapshot(4)
    with pytest.raises(StorageLostError, match="no longer exists .* never creates buckets"):
        write_snapshot(snapshot, storage.join(s3_bucket, "run/checkpoint-4"), save, opts)
    assert not bucket_exists(opts, s3_bucket)


def test_storage_emptied_between_saves_stops_the_writer(s3_server, s3_bucket):
    opts, out = s3_server.storage_options, s3_bucket + "/run"
    held = lease.acquire(out, "run-1", opts, heartbeat=False)
    writer = CheckpointWriter(out, opts, save_async=False, save_total_limit=None, on_commit=lambda *a: None,
                              guard=lambda: lease.check_held(out, "run-1", opts))
    writer.submit(*_snapshot(4), best_url=None)
    empty_bucket(opts, s3_bucket)  # the endpoint "came back empty"
    with pytest.raises(StorageLostError, match="lease .* is gone"):
        writer.submit(*_snapshot(8), best_url=None)
    assert not manifest.is_committed(storage.join(out, "checkpoint-8"), opts)  # nothing committed after it
    held.release()


def test_an_outage_is_ridden_out(s3_server, s3_bucket):
    proxy = OutageProxy(s3_server.endpoint_url)
    opts = {**s3_server.storage_options, "endpoint_url": proxy.endpoint_url,
            "config_kwargs": {"connect_timeout": 1, "read_timeout": 5}}
    url = storage.join(s3_bucket, "run/checkpoint-4")
    snapshot, save = _snapshot(4)
    proxy.cut()
    # A 4 s outage, from before the first byte (the 10 s one of a real run: test_reliability_storage.py).
    threading.Timer(4.0, proxy.restore).start()
    started = time.monotonic()
    write_snapshot(snapshot, url, save, opts, retry=Retry(timeout_s=60, storage_options=opts))
    assert time.monotonic() - started >= 3.5
    assert verify(url, opts) is None  # committed, every checksum right
    proxy.close()


def test_an_outage_longer_than_the_limit_fails_as_retriable(s3_server, s3_bucket):
    proxy = OutageProxy(s3_server.endpoint_url)
    opts = {**s3_server.storage_options, "endpoint_url": proxy.endpoint_url,
            "config_kwargs": {"connect_timeout": 1, "read_timeout": 2, "retries": {"max_attempts": 1}}}
    proxy.cut()
    snapshot, save = _snapshot(4)
    with pytest.raises(StorageError, match=r"kept failing for 2 s while .* \(EndpointConnectionError") as raised:
        write_snapshot(snapshot, storage.join(s3_bucket, "run/checkpoint-4"), save, opts,
                       retry=Retry(timeout_s=2, storage_options=opts))
    assert not isinstance(raised.value, StorageFatalError)  # counts as one of max_failures, no more
    proxy.close()


def test_a_full_disk_fails_once_with_the_fix():
    with small_disk("2m") as disk:
        snapshot, save = _snapshot(4, extra_bytes=4 << 20)
        calls = []
        retry = Retry(timeout_s=60, sleep=lambda s: calls.append(s))
        started = time.monotonic()
        with pytest.raises(StorageFatalError, match="No space left .* lower save_total_limit"):
            write_snapshot(snapshot, disk + "/run/checkpoint-4", save, None, retry=retry)
        assert calls == [] and time.monotonic() - started < 30  # not retried
        assert not manifest.is_committed(disk + "/run/checkpoint-4")


def test_a_read_only_disk_fails_once_with_the_fix():
    with small_disk("1m", read_only=True) as disk:
        snapshot, save = _snapshot(4)
        with pytest.raises(StorageFatalError, match="Permission denied .* write, read, list and delete access"):
            write_snapshot(snapshot, disk + "/checkpoint-4", save, None)
