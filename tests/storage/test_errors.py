"""Storage errors and their classification (raytrainer/storage/errors.py): secrets redacted; which failures are
fatal (with the fix), which are worth waiting out, which are a refused conditional write."""

from __future__ import annotations

import errno

import pytest
from botocore.exceptions import ClientError, EndpointConnectionError

from raytrainer.errors import StorageError
from raytrainer.storage import errors
from raytrainer.storage.errors import StorageFatalError, StorageLostError
from tests.storage.stores import SECRET_OPTIONS


def _s3_error(code: str, status: int = 400) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
                       "PutObject")


def test_redact_hides_option_and_environment_secrets(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "envSecretValue99")
    text = f"k={SECRET_OPTIONS['key']} s={SECRET_OPTIONS['secret']} t=tok-123456 e=envSecretValue99 us-east-1"
    out = errors.redact(text, SECRET_OPTIONS)
    assert out == "k=*** s=*** t=*** e=*** us-east-1"


def test_fatal_errors_name_the_fix():
    full = errors.fatal_error(OSError(errno.ENOSPC, "No space left on device"), "/data/run", "writing checkpoint-4")
    assert isinstance(full, StorageFatalError) and "lower save_total_limit" in str(full)
    denied = errors.fatal_error(_s3_error("AccessDenied", 403), "s3://b/run", "committing")
    assert isinstance(denied, StorageFatalError) and "write, read, list and delete access" in str(denied)
    lost = errors.fatal_error(_s3_error("NoSuchBucket", 404), "s3://b/run/checkpoint-4", "uploading")
    assert isinstance(lost, StorageLostError) and "'b'" in str(lost) and "never creates buckets" in str(lost)
    assert errors.fatal_error(ValueError("bad"), "/data/run", "writing") is None  # not one we know
    for error in (full, denied, lost):
        assert isinstance(error, StorageError) and error.fatal  # the run fails once, not max_failures times


def test_transient_errors_are_read_through_the_chain():
    try:
        try:
            raise ConnectionResetError(errno.ECONNRESET, "reset by peer")
        except OSError as exc:
            raise RuntimeError("upload failed") from exc
    except RuntimeError as exc:
        wrapped = exc
    assert errors.is_transient(wrapped)
    assert errors.is_transient(EndpointConnectionError(endpoint_url="http://127.0.0.1:1"))
    assert errors.is_transient(_s3_error("SlowDown", 503))
    assert not errors.is_transient(FileNotFoundError("s3://b/run/x"))
    assert not errors.is_transient(_s3_error("AccessDenied", 403))


def test_a_refused_conditional_write():
    assert errors.precondition_failed(FileExistsError("exists"))
    assert errors.precondition_failed(OSError("PreconditionFailed: At least one of the pre-conditions failed"))
    assert not errors.precondition_failed(OSError("connection reset"))


def test_describe_error_names_the_fix_without_secrets():
    message = str(errors.describe_error("s3://b/run", PermissionError(f"denied for {SECRET_OPTIONS['key']}"),
                                        SECRET_OPTIONS))
    assert "Access denied to s3://b/run" in message and SECRET_OPTIONS["key"] not in message
    message = str(errors.describe_error("/data/run", errors.ProbeTimeout(), timeout_s=0.5))
    assert "did not answer within 0.5 s" in message


@pytest.mark.parametrize("kind", [StorageFatalError, StorageLostError])
def test_fatal_types_are_storage_errors(kind):
    assert issubclass(kind, StorageError) and kind.fatal
