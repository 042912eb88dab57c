"""Runs one job (train / evaluate / predict) on a Ray Train worker group, or in the driver process.

Ray Train V2 does placement, process-group set-up and restarts (FailureConfig); we add the event sink:
the driver's main thread drains it and runs the callbacks while `fit()` runs in a helper thread, so
progress, logs and restarts show up live, and callbacks run where the user's code runs.
"""

from __future__ import annotations

import threading
from typing import Any, Dict

from ..callbacks.base import CallbackHandler
from ..callbacks.channel import DirectSink, Emitter, EventSink
from ..verbosity import train_logging_config
from ..worker.context import WorkerContext
from ..worker.entry import ray_worker_main, run_job

# How long the driver waits for events before checking whether fit() ended; events wake it at once.
POLL_INTERVAL_S = 0.2


class TrainingError(RuntimeError):
    """A worker raised: the message carries the worker's own error, the cause holds the exception."""


def run_in_process(trainer, job: Dict[str, Any], handler: CallbackHandler, use_gpu: bool) -> Any:
    """num_workers=0: the same job, in this process, with events dispatched as they are emitted."""
    ctx = WorkerContext.in_process(use_gpu)
    return run_job(trainer, job, ctx, Emitter(DirectSink(handler), rank=0, flush_interval_s=0.0))


def run_on_ray(payload: bytes, job: Dict[str, Any], handler: CallbackHandler, args, use_gpu: bool,
               run_name: str) -> Any:
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from .failures import FailureRecorder

    sink = ray.remote(num_cpus=0, max_concurrency=64)(EventSink).remote()
    try:
        torch_trainer = TorchTrainer(
            ray_worker_main,
            train_loop_config={"payload": payload, "job": job, "sink": sink},
            scaling_config=ScalingConfig(num_workers=args.num_workers, use_gpu=use_gpu,
                                         resources_per_worker=args.resources_per_worker),
            run_config=RunConfig(name=run_name, failure_config=FailureConfig(max_failures=args.max_failures),
                                 callbacks=[FailureRecorder(sink)], logging_config=train_logging_config(args)),
            torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
        )
        _fit_while_pumping(torch_trainer, sink, handler)
        return ray.get(sink.get_result.remote())
    finally:
        ray.kill(sink)


def _fit_while_pumping(torch_trainer, sink, handler: CallbackHandler):
    import ray

    outcome: Dict[str, Any] = {}

    def fit():
        try:
            torch_trainer.fit()
        except BaseException as exc:  # re-raised in the main thread below
            outcome["error"] = exc

    thread = threading.Thread(target=fit, name="raytrainer-fit", daemon=True)
    thread.start()
    while thread.is_alive():
        _dispatch(ray.get(sink.wait_events.remote(POLL_INTERVAL_S)), sink, handler)
    _dispatch(ray.get(sink.wait_events.remote(0)), sink, handler)
    if "error" in outcome:
        raise _unwrap(outcome["error"]) from outcome["error"]


def _dispatch(events, sink, handler: CallbackHandler):
    """Run the callbacks on the events in order; answer rank 0's control requests once the events before
    them have been handled, so a decision reflects everything up to that point."""
    for event in events:
        if event["kind"] == "control_request":
            sink.decide.remote(event["id"], handler.take_control())
        else:
            handler.handle(event)


def _unwrap(error: BaseException) -> BaseException:
    """Ray Train wraps worker errors; give the user the first worker's own error message."""
    failures = getattr(error, "worker_failures", None)
    if failures:
        rank, exc = sorted(failures.items())[0]
        cause = getattr(exc, "cause", None) or exc
        return TrainingError(f"Training failed on worker rank {rank}: {type(cause).__name__}: {cause}")
    return TrainingError(str(error))
