"""Which storage errors are worth waiting out, and for how long.

A transient error (connection refused or reset, a timeout, S3's 5xx and SlowDown) is retried with
exponential backoff until `storage_retry_timeout_s` has passed, so a short outage costs a pause, not one of
`max_failures`. A non-transient one (no space left, permission denied, the bucket gone) is raised at once as
a `StorageFatalError` that names the fix: retrying it, here or by restarting the worker group, only spends
time and the failure budget.
"""

from __future__ import annotations

import errno
import time
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

from ..errors import StorageError
from ..verbosity import notice
from . import exception_chain, redact

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 120.0
_FIRST_DELAY_S, _MAX_DELAY_S = 0.5, 8.0

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


class StorageFatalError(StorageError):
    """A storage failure that no retry or worker-group restart can fix; the run fails once, with the fix."""

    fatal = True


class StorageLostError(StorageFatalError):
    """The storage no longer holds what this run committed (emptied, or its bucket deleted)."""


def _codes(exc: BaseException) -> set:
    codes = set()
    for e in exception_chain(exc):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            error = response.get("Error") or {}
            codes.add(str(error.get("Code", "")))
            codes.add(str((response.get("ResponseMetadata") or {}).get("HTTPStatusCode", "")))
    return codes


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
    bucket = url.partition("://")[2].split("/", 1)[0]
    return StorageLostError(
        f"The bucket {bucket!r} of {url} no longer exists (found while {what}): the storage lost this run's "
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


@dataclass
class Retry:
    """Run storage operations, waiting out transient errors for up to `timeout_s` per operation."""

    timeout_s: float = DEFAULT_TIMEOUT_S
    storage_options: Optional[dict] = None  # only to keep its secrets out of messages
    sleep: Callable[[float], None] = time.sleep

    def call(self, fn: Callable[[], T], url: str, what: str) -> T:
        deadline = time.monotonic() + max(self.timeout_s, 0.0)
        delay, told = _FIRST_DELAY_S, False
        while True:
            try:
                return fn()
            except StorageFatalError:
                raise
            except Exception as exc:  # noqa: BLE001 (classified below; anything unknown is raised as it is)
                fatal = fatal_error(exc, url, what)
                if fatal is not None:
                    raise type(fatal)(redact(str(fatal), self.storage_options)) from exc
                remaining = deadline - time.monotonic()
                if not is_transient(exc) or remaining <= 0:
                    if is_transient(exc):
                        raise StorageError(redact(
                            f"Storage for {url} kept failing for {self.timeout_s:g} s while {what} "
                            f"({type(exc).__name__}: {exc}). Check that it is reachable; storage_retry_timeout_s "
                            "sets how long an outage is waited out.", self.storage_options)) from exc
                    raise
                if not told:
                    notice(f"storage for {url} failed while {what} ({type(exc).__name__}); retrying for up "
                            f"to {self.timeout_s:g} s (storage_retry_timeout_s)")
                    told = True
                self.sleep(min(delay, remaining))
                delay = min(delay * 2, _MAX_DELAY_S)


