"""Retries (raytrainer/storage/retry.py): a transient error is waited out with backoff, said once; a fatal one is
raised at once with the fix; an outage longer than the limit is an ordinary (retriable) StorageError; anything
else is raised as it is."""

from __future__ import annotations

import errno

import pytest

from raytrainer.errors import StorageError
from raytrainer.storage.errors import StorageFatalError, StorageLostError
from raytrainer.storage.retry import Retry


def _failing(*errors, result="done"):
    """A callable that raises each of `errors` in turn, then returns `result`; `.calls` counts the calls."""
    pending = list(errors)

    def fn():
        fn.calls += 1
        if pending:
            raise pending.pop(0)
        return result

    fn.calls = 0
    return fn


def test_a_transient_error_is_waited_out_with_backoff_and_said_once(capfd):
    slept = []
    retry = Retry(timeout_s=60, sleep=slept.append)
    fn = _failing(ConnectionResetError(errno.ECONNRESET, "reset"), ConnectionRefusedError(errno.ECONNREFUSED, "no"),
                  TimeoutError("slow"))
    assert retry.call(fn, "s3://b/run", "uploading") == "done"
    assert fn.calls == 4 and slept == [0.5, 1.0, 2.0]
    assert capfd.readouterr().err.count("retrying for up to 60 s (storage_retry_timeout_s)") == 1


def test_a_fatal_error_is_raised_at_once_with_the_fix_and_no_secret():
    slept = []
    retry = Retry(timeout_s=60, storage_options={"secret": "s3cr3t"}, sleep=slept.append)
    fn = _failing(PermissionError(errno.EACCES, "denied with s3cr3t"))
    with pytest.raises(StorageFatalError, match="Permission denied while committing") as info:
        retry.call(fn, "/data/run", "committing")
    assert fn.calls == 1 and slept == [] and "s3cr3t" not in str(info.value)
    lost = StorageLostError("gone")
    with pytest.raises(StorageLostError) as info:
        retry.call(_failing(lost), "/data/run", "committing")
    assert info.value is lost  # already fatal: raised as it is


def test_an_outage_longer_than_the_limit_is_a_retriable_storage_error():
    retry = Retry(timeout_s=0, sleep=lambda s: pytest.fail("no time left to wait"))
    with pytest.raises(StorageError, match=r"kept failing for 0 s while uploading \(ConnectionResetError") as info:
        retry.call(_failing(ConnectionResetError(errno.ECONNRESET, "reset")), "s3://b/run", "uploading")
    assert not isinstance(info.value, StorageFatalError)  # counts as one of max_failures


def test_an_unknown_error_is_raised_as_it_is():
    error = ValueError("not storage's")
    with pytest.raises(ValueError) as info:
        Retry(sleep=lambda s: pytest.fail("not retried")).call(_failing(error), "/data/run", "reading")
    assert info.value is error
