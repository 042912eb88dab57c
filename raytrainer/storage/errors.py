"""Storage errors: what went wrong, in words that name the fix, and whether waiting can help.

An exception from fsspec, s3fs, botocore or the OS is read here, through its whole chain of causes:

- `describe_error`: why a URL cannot be used and how to fix it, as a `StorageError` (the driver's writability
  probe, the CLI, the TensorBoard upload).
- `fatal_error`: a failure that no retry or worker-group restart can fix (no space left, permission denied,
  the bucket gone), as a `StorageFatalError` that names the fix; the run fails once.
- `is_transient`: a failure worth waiting out (connection refused or reset, a timeout, S3's 5xx and
  SlowDown); `retry.Retry` waits.
- `precondition_failed`: a conditional write refused because the object exists or changed.

No message carries a secret: `redact` removes every credential of storage_options and the AWS environment.
"""

from __future__ import annotations

import errno
import os
from typing import Optional

from ..errors import StorageError
from .urls import OBJECT_STORE_PROTOCOLS, S3_PROTOCOLS, bucket, is_local, protocol

_SECRET_WORDS = ("key", "secret", "token", "password", "credential")
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ACCESS_KEY_ID")

_UNREACHABLE = {"EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError", "ConnectionError",
                "ConnectionRefusedError", "gaierror", "ProxyConnectionError", "ServerDisconnectedError"}
_NO_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError"}

_TRANSIENT_NAMES = {
    "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError",
    "ClientConnectorError", "ClientConnectionError", "ServerDisconnectedError", "ClientOSError",
    "ClientPayloadError", "ServerTimeoutError", "IncompleteReadError", "ResponseStreamingError",
    "ConnectionError", "ConnectionResetError", "ConnectionRefusedError", "ConnectionAbortedError",
    "BrokenPipeError", "TimeoutError", "FSTimeoutError", "ProxyConnectionError", "HTTPClientError",
}
_TRANSIENT_CODES = {"SlowDown", "ServiceUnavailable", "InternalError", "RequestTimeout", "Throttling",
                    "ThrottlingException", "RequestTimeTooSkewed", "500", "502", "503", "504"}
_TRANSIENT_ERRNOS = {errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED, errno.ETIMEDOUT, errno.EPIPE,
                     errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EAGAIN}
_DENIED_CODES = {"AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                 "InvalidToken", "AllAccessDisabled"}


# ------------------------------------------------------------------------------------------------ types
class StorageFatalError(StorageError):
    """A storage failure that no retry or worker-group restart can fix; the run fails once, with the fix."""

    fatal = True


class StorageLostError(StorageFatalError):
    """The storage no longer holds what this run committed (emptied, or its bucket deleted)."""


class ProbeTimeout(Exception):
    """The writability probe got no answer in time (probe.py); `describe_error` words it."""


class FileInTheWay(Exception):
    """The writability probe found a file where the output directory should be (probe.py)."""


# -------------------------------------------------------------------------------------------- secrets
def _secret_values(options, secret_key: bool = False):
    if isinstance(options, dict):
        for key, value in options.items():
            yield from _secret_values(value, secret_key or any(w in str(key).lower() for w in _SECRET_WORDS))
    elif secret_key and isinstance(options, str) and options:
        yield options


def redact(text: str, storage_options: dict | None = None) -> str:
    """`text` with every credential from storage_options and the AWS environment replaced by `***`."""
    secrets = set(_secret_values(storage_options or {}))
    secrets.update(os.environ[name] for name in _SECRET_ENV if os.environ.get(name))
    for secret in sorted(secrets, key=len, reverse=True):  # longest first: one secret may contain another
        text = text.replace(secret, "***")
    return text


# --------------------------------------------------------------------------------------- reading errors
def exception_chain(exc: BaseException):
    """`exc`, then its causes and contexts, each once."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _codes(exc: BaseException) -> set:
    """The S3 error codes and HTTP statuses anywhere in the chain (botocore's `response`)."""
    codes = set()
    for e in exception_chain(exc):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            error = response.get("Error") or {}
            codes.add(str(error.get("Code", "")))
            codes.add(str((response.get("ResponseMetadata") or {}).get("HTTPStatusCode", "")))
    return codes


def _endpoint(storage_options: dict | None) -> str:
    options = storage_options or {}
    return (options.get("endpoint_url") or (options.get("client_kwargs") or {}).get("endpoint_url")
            or os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
            or "the default AWS S3 endpoint")


# ------------------------------------------------------------------------------ why a URL cannot be used
def describe_error(url: str, exc: BaseException, storage_options: dict | None = None,
                   timeout_s: float | None = None) -> StorageError:
    """A `StorageError` saying why `url` could not be used and how to fix it, secrets redacted."""
    url = str(url)
    chain = list(exception_chain(exc))
    names = {cls.__name__ for e in chain for cls in type(e).__mro__}
    reason = redact(f"{type(exc).__name__}: {exc}", storage_options)
    remote = not is_local(url)
    scheme = protocol(url)
    endpoint = _endpoint(storage_options) if scheme in S3_PROTOCOLS else None
    where = f" at {endpoint}" if endpoint else ""

    if isinstance(exc, ProbeTimeout):
        text = (f"Storage for {url}{where} did not answer within {timeout_s:g} s. Check that the endpoint is "
                "right and reachable from this machine (network, proxy, firewall), or that the mounted "
                "filesystem is not hung.")
    elif remote and names & _UNREACHABLE:
        text = (f"Cannot reach the storage endpoint{where} for {url} ({reason}). Check the endpoint URL "
                "(storage_options['endpoint_url'] or AWS_ENDPOINT_URL), that the service is running, and "
                "that this machine can connect to it.")
    elif names & _NO_CREDENTIALS:
        text = (f"No usable credentials for {url}{where} ({reason}). Pass storage_options={{'key': ..., "
                "'secret': ...} or set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE).")
    elif isinstance(exc, FileInTheWay):
        text = (f"{url} exists and is a file, not a directory: choose another output_dir or remove the file.")
    elif isinstance(exc, (NotADirectoryError, FileExistsError)):
        text = (f"Cannot create the directory {url}: part of the path is an existing file ({reason}). Choose "
                "another output_dir or remove that file.")
    elif isinstance(exc, PermissionError) or getattr(exc, "errno", None) in (errno.EACCES, errno.EPERM,
                                                                              errno.EROFS):
        if remote:
            text = (f"Access denied to {url}{where} ({reason}). Check the credentials (storage_options 'key'/"
                    "'secret', or AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_PROFILE) and that they allow "
                    "listing the bucket and putting, getting and deleting objects under this prefix.")
        else:
            text = (f"Cannot write to {url}: permission denied or read-only filesystem ({reason}). Choose a "
                    "directory this user can write to, or fix its permissions (e.g. chmod u+w).")
    elif isinstance(exc, FileNotFoundError) and scheme in OBJECT_STORE_PROTOCOLS:
        name = bucket(url)
        text = (f"The bucket {name!r} of {url} does not exist{where} ({reason}). Create it first (e.g. "
                f"`aws s3 mb {scheme}://{name}`), or point output_dir at an existing bucket.")
    else:
        text = (f"Cannot use {url}{where} ({reason}). Check the URL and storage_options.")
    return StorageError(redact(text, storage_options))


# --------------------------------------------------------------------------- fatal, transient, refused
def fatal_error(exc: BaseException, url: str, what: str) -> Optional[StorageFatalError]:
    """The fatal error `exc` amounts to while doing `what` on `url`, or None when it is not one we know."""
    chain = list(exception_chain(exc))
    text = " ".join(str(e) for e in chain)
    errnos = {getattr(e, "errno", None) for e in chain}
    codes = _codes(exc)
    if errnos & {errno.ENOSPC, errno.EDQUOT} or "No space left on device" in text or "os error 28" in text:
        return StorageFatalError(
            f"No space left while {what} ({url}). Free space there, lower save_total_limit so fewer checkpoints "
            "are kept, or point output_dir at a larger volume; then resume with "
            "train(resume_from_checkpoint=True).")
    if ("NoSuchBucket" in codes or "NoSuchBucket" in text or "specified bucket does not exist" in text):
        return bucket_lost(url, what)
    denied = codes & _DENIED_CODES or any(isinstance(e, PermissionError) for e in chain) or (
        errnos & {errno.EACCES, errno.EPERM, errno.EROFS})
    if denied:
        return StorageFatalError(
            f"Permission denied while {what} ({url}): {type(exc).__name__}: {exc}. Give this user (or these "
            "credentials) write, read, list and delete access to output_dir, or choose another output_dir.")
    return None


def bucket_lost(url: str, what: str) -> StorageLostError:
    return StorageLostError(
        f"The bucket {bucket(url)!r} of {url} no longer exists (found while {what}): the storage lost this run's "
        "checkpoints, or the bucket was deleted. raytrainer never creates buckets, so the run stops here "
        "instead of starting again from step 0. Restore the bucket (and its checkpoints), or start a new run "
        "with an output_dir in an existing bucket.")


def is_transient(exc: BaseException) -> bool:
    chain = list(exception_chain(exc))
    if any(cls.__name__ in _TRANSIENT_NAMES for e in chain for cls in type(e).__mro__):
        return True
    if any(getattr(e, "errno", None) in _TRANSIENT_ERRNOS for e in chain):
        return True
    return bool(_codes(exc) & _TRANSIENT_CODES)


def precondition_failed(exc: BaseException) -> bool:
    """A conditional write (S3's `If-None-Match: *` / `If-Match: <etag>`, a local create-if-absent) refused:
    the object exists, or changed since it was read."""
    text = f"{type(exc).__name__} {exc} {exc.__cause__!r}"
    return isinstance(exc, FileExistsError) or "PreconditionFailed" in text or "412" in text or (
        "ConditionalRequestConflict" in text)
