"""Retries: a storage operation whose error is transient is tried again, with exponential backoff, until
`storage_retry_timeout_s` has passed, so a short outage costs a pause, not one of `max_failures`.

What counts as transient or fatal is errors.py's to say: a fatal error (no space left, permission denied, the
bucket gone) is raised at once as a `StorageFatalError` that names the fix, since retrying it, here or by
restarting the worker group, only spends time and the failure budget; an error of neither kind is raised as it
is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional, TypeVar

from ..errors import StorageError
from ..verbosity import notice
from .errors import StorageFatalError, fatal_error, is_transient, redact

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 120.0
_FIRST_DELAY_S, _MAX_DELAY_S = 0.5, 8.0


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
