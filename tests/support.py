"""Small helpers the test modules share: the repository root, the session Ray's CPUs, free ports on loopback, a
poll until a condition holds, a driver callback that records the logs and evaluations it hears, a worker that
dies once a checkpoint commits."""

from __future__ import annotations

import os
import socket
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Logical CPUs of the test session's Ray (tests/conftest.py): the pool's idle 2-worker and 1-worker groups, plus a
# subprocess driver's 2 workers beside them (the `join_session_ray` fixture), on a 2-core machine.
SESSION_CPUS = 6


def free_ports(n: int = 1) -> list:
    """`n` distinct ports nothing listens on (bound together, so they differ; closed before returning)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port() -> int:
    return free_ports(1)[0]


def wait_for(condition, timeout_s: float = 5.0, every_s: float = 0.01) -> bool:
    """Whether `condition()` came true within `timeout_s` (polled every `every_s`)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() >= deadline:
            return False
        time.sleep(every_s)
    return True


def logs_and_evaluations_recorder():
    """A driver callback class (built on call: this module imports no raytrainer) recording `(event,
    global_step)` for each on_log and on_evaluate it hears, in `events`."""
    from raytrainer.callbacks.base import TrainerCallback

    class Recorder(TrainerCallback):
        def __init__(self):
            self.events = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.events.append(("log", state.global_step))

        def on_evaluate(self, args, state, control, **kwargs):
            self.events.append(("evaluate", state.global_step))

    return Recorder


def die_once_committed(checkpoint: str, marker: str, storage_options=None):
    """End this worker's process (an injected lost worker) once `checkpoint` is committed, leaving `marker` first:
    the caller checks it, so the run's restarted group does not die again."""
    from raytrainer.checkpoint.manifest import is_committed

    while not is_committed(checkpoint, storage_options):
        time.sleep(0.05)
    open(marker, "w").close()
    os._exit(1)
