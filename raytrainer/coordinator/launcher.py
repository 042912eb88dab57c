"""Runs one job (train / evaluate / predict) on a Ray Train worker group, or in the driver process.

Ray Train V2 does placement, process-group set-up and restarts (FailureConfig); we add the event sink:
the driver's main thread drains it and runs the callbacks while `fit()` runs in a helper thread, so
progress, logs and restarts show up live, and callbacks run where the user's code runs.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional

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


def run_on_ray(packed, handler: CallbackHandler, args, use_gpu: bool, run_name: str,
               receive: Callable[[Any], Any], datasets: Optional[Dict[str, Any]] = None,
               data_config=None) -> Any:
    """`packed`: the trainer and job (`transfer.Packed`). Its arrays go into the object store once, here;
    every worker (and every restarted worker group) maps them from there. `receive(result)` runs while the
    objects in the result (the trained weights, owned by rank 0) still exist. `datasets`: Ray Datasets for
    Ray Train to shard (`data_config` says how, see data/ray_data.py)."""
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from .failures import FailureRecorder, FreshClusterView, ResizeRecorder

    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # On the driver's node: a sink on a worker node would die with it (a lost node must only cost workers).
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    sink = ray.remote(num_cpus=0, max_concurrency=64)(EventSink).options(scheduling_strategy=here).remote()
    try:
        data = ray.put(packed.data)  # owned by the driver: lives until this run ends, restarts included
        # An elastic range goes to Ray Train as it is: it places between min and max workers at each start
        # and restart, and resizes a healthy group every elastic_resize_monitor_interval_s (README: "Elastic").
        scaling = dict(num_workers=tuple(args.num_workers), elastic_resize_monitor_interval_s=
                       args.elastic_resize_monitor_interval_s) if args.elastic else dict(num_workers=args.max_workers)
        torch_trainer = TorchTrainer(
            ray_worker_main,
            train_loop_config={"payload": packed.payload, "data": data, "sink": sink},
            scaling_config=ScalingConfig(**scaling, use_gpu=use_gpu, resources_per_worker=args.resources_per_worker),
            run_config=RunConfig(name=run_name, failure_config=FailureConfig(
                                     max_failures=args.max_failures, max_preemption_failures=args.max_preemptions),
                                 callbacks=[FailureRecorder(sink), ResizeRecorder(sink)] + (
                                     [FreshClusterView(args.elastic_resize_monitor_interval_s)] if args.elastic
                                     else []),
                                 logging_config=train_logging_config(args)),
            torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo"),
            **({"datasets": datasets, "dataset_config": data_config} if datasets else {}),
        )
        return _fit_while_pumping(torch_trainer, sink, handler, receive)
    finally:
        ray.kill(sink)


def _fit_while_pumping(torch_trainer, sink, handler: CallbackHandler, receive: Callable[[Any], Any]) -> Any:
    """Run fit() in a helper thread; here, run callbacks on the events as they come, and read the result
    as soon as rank 0 has set it (it waits for that before exiting: it owns the trained weights' object)."""
    import ray

    outcome: Dict[str, Any] = {}

    def fit():
        try:
            torch_trainer.fit()
        except BaseException as exc:  # re-raised in the main thread below
            outcome["error"] = exc

    def take():
        try:
            outcome["result"] = receive(ray.get(sink.get_result.remote()))
        except BaseException as exc:
            outcome["receive_error"] = exc
        finally:
            ray.get(sink.mark_result_taken.remote())

    def pump(timeout_s: float):
        """Run the callbacks on the events in order; answer rank 0's control requests once the events
        before them are handled, so a decision reflects everything up to that point; take the result when
        rank 0 says it is there."""
        for event in ray.get(sink.wait_events.remote(timeout_s)):
            if event["kind"] == "control_request":
                sink.decide.remote(event["id"], handler.take_control())
            elif event["kind"] == "result_ready":
                take()
            else:
                handler.handle(event)

    thread = threading.Thread(target=fit, name="raytrainer-fit", daemon=True)
    thread.start()
    with _first_ctrl_c_stops(sink) as stopping:
        while thread.is_alive():
            pump(POLL_INTERVAL_S)
            stopping.relay()
    pump(0)
    if "error" in outcome:
        raise _unwrap(outcome["error"]) from outcome["error"]
    if "result" not in outcome and "receive_error" not in outcome:
        take()
    if "receive_error" in outcome:
        raise outcome["receive_error"]
    return outcome["result"]


class _first_ctrl_c_stops:
    """While fit() runs: the first Ctrl-C asks every rank to save at its next step boundary and end the run
    (train() then raises KeyboardInterrupt); a second one raises at once and abandons the run. The handler
    only sets a flag: a KeyboardInterrupt in the middle of the pump could drop a control request that rank 0
    waits on. Only the main thread can set handlers; elsewhere Ctrl-C keeps Python's behaviour."""

    def __init__(self, sink):
        self.sink = sink
        self.pressed = self.relayed = False
        self.previous = None

    def __enter__(self):
        import signal

        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGINT, self._on_sigint)
        return self

    def _on_sigint(self, signum, frame):
        if self.pressed:
            raise KeyboardInterrupt
        self.pressed = True

    def relay(self):
        if self.pressed and not self.relayed:
            import ray

            self.relayed = True
            print("[raytrainer] interrupted: saving a checkpoint at the next step, then stopping "
                  "(Ctrl-C again to abandon the run)", flush=True)
            ray.get(self.sink.request_stop.remote("interrupt"))

    def __exit__(self, *exc):
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        return False


def _unwrap(error: BaseException) -> BaseException:
    """Ray Train wraps worker errors; give the user the first worker's own error message."""
    failures = getattr(error, "worker_failures", None)
    if failures:
        rank, exc = sorted(failures.items())[0]
        cause = getattr(exc, "cause", None) or exc
        return TrainingError(f"Training failed on worker rank {rank}: {type(cause).__name__}: {cause}")
    return TrainingError(str(error))
