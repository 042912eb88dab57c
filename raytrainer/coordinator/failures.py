"""Tells the event sink why a worker group failed, so the restart that follows can say so.

A Ray Train `UserCallback` runs in the Ray Train controller actor; it reaches the driver's event sink
through the actor handle it was pickled with.
"""

from __future__ import annotations

from ray.train import UserCallback


class FailureRecorder(UserCallback):
    def __init__(self, sink):
        self.sink = sink

    def after_exception(self, run_context, worker_exceptions):
        import ray

        parts = [f"rank {rank}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
                 for rank, exc in sorted(worker_exceptions.items())]
        ray.get(self.sink.record_failure.remote("; ".join(parts)[:500]))
