"""Calls on an `EventSink` from a test, without Ray: the sink is a plain class until `ray.remote` wraps it, so a
test runs its async methods on the `loop` fixture's asyncio loop (tests/coordinator/conftest.py)."""

from __future__ import annotations

import asyncio

from raytrainer.coordinator.sink import EventSink
from raytrainer.protocol import Job, JobKind


def job(name: str = "a") -> Job:
    return Job(id=name, job_kind=JobKind.TRAIN, payload=b"", data=None)


def run(loop, coro, timeout_s: float = 1.0):
    return loop.run_until_complete(asyncio.wait_for(coro, timeout_s))


def waits(loop, coro, timeout_s: float = 0.05) -> bool:
    """True if `coro` is still waiting after `timeout_s`."""
    try:
        run(loop, coro, timeout_s)
    except asyncio.TimeoutError:
        return True
    return False


def take_all(loop, sink: EventSink) -> list:
    return run(loop, sink.wait_events(0))
