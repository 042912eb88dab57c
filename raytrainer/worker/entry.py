"""The function every Ray Train worker runs (and the driver, for num_workers=0).

A worker serves the jobs of its Trainer's worker group, one after the other (`coordinator/group.py`). For each
one the driver ships the whole `Trainer` (pickled once, with cloudpickle, so a user's subclass and its hooks
come along; its weights and large data through the object store, see `transfer.py`); each worker rebuilds
its own copy, runs the job's work order (`protocol.TrainOrder`, `EvaluateOrder`, `PredictOrder`), and rank 0
hands the result (`protocol.TrainResult`, ...) to the event sink (the trained weights as an object in the
store).
"""

from __future__ import annotations

import dataclasses
import gc
import traceback
from typing import Any, Dict, Optional, Union

import torch

from ..callbacks.channel import Emitter
from ..protocol import (
    ERROR,
    EvaluateOrder,
    EvaluateResult,
    HostedOrder,
    HostedResult,
    Job,
    PredictResult,
    TrainOrder,
    TrainResult,
    WorkOrder,
)
from ..startup import Timeline
from ..verbosity import configure_worker
from ..worker_context import WorkerContext
from .evaluation import evaluation_loop
from .loop import TrainLoop
from .loop_events import LoopEvents
from .memory import give_back_freed_memory, keep_freed_memory
from .process_options import setup_process, torch_flags_kept
from .user_errors import WorkerError, quiet_wrapped_tracebacks

Result = Union[TrainResult, EvaluateResult, PredictResult, HostedResult, None]


def run_job(trainer, order: WorkOrder, ctx: WorkerContext, emitter: Emitter, on_ray: bool = False,
            startup: Optional[Timeline] = None, taken_at: Optional[float] = None) -> Result:
    """Run one work order on this rank; rank 0's result (None on the other ranks). `startup`: a train job's
    start-up timeline on this rank, from the job's receipt (`startup.py`); `taken_at`: the sink's stamp of rank
    0 taking the job. A `HostedOrder`'s `trainer` is its target (a script, or a trainer to build: hosting/)."""
    with torch_flags_kept():  # full_determinism or tf32 of this job do not reach the next one on a kept worker
        return _run_job(trainer, order, ctx, emitter, on_ray, startup, taken_at)


def _run_job(trainer, order: WorkOrder, ctx: WorkerContext, emitter: Emitter, on_ray: bool,
             startup: Optional[Timeline], taken_at: Optional[float]) -> Result:
    if isinstance(order, HostedOrder):
        from .hosted import run_hosted  # imports transformers: only for hosted jobs

        return run_hosted(trainer, order, ctx, emitter, on_ray)
    trainer.ctx = ctx
    place_auxiliary_modules(trainer, ctx.device)
    events = LoopEvents(trainer, ctx, emitter, order.control_points, order.rank_callbacks,
                        next_step=trainer.args.callback_decisions == "next_step", heard=order.heard)
    if isinstance(order, TrainOrder):
        # Its set-up marks the rest of the start-up timeline; rank 0 reports them.
        loop = TrainLoop(trainer, ctx, emitter, events, order.run_id, order.resume_from, on_ray=on_ray,
                         startup=startup, taken_at=taken_at, own_hyperparameters=order.own_hyperparameters)
        return loop.run()

    # evaluate / predict: the model as the driver holds it, on this worker's device, no wrapper needed.
    setup_process(trainer.args, ctx.device)  # seed or full_determinism, tf32, as for training
    model = trainer.model if trainer.model is not None else trainer.model_init()
    trainer.model = trainer.model_wrapped = model.to(ctx.device)
    if isinstance(order, EvaluateOrder):
        dataloader = trainer.get_eval_dataloader(order.dataset)
        output = evaluation_loop(trainer, dataloader, ignore_keys=order.ignore_keys,
                                 metric_key_prefix=order.prefix, on_step=events.emit)
        return EvaluateResult(output.metrics) if ctx.is_main else None
    # prediction_loss_only=True gives predict() the loss alone (predictions and labels None), as in HF.
    output = evaluation_loop(trainer, trainer.get_test_dataloader(order.dataset), ignore_keys=order.ignore_keys,
                             metric_key_prefix=order.prefix, on_step=events.emit, keep_predictions=True)
    return PredictResult(output) if ctx.is_main else None


def place_auxiliary_modules(trainer, device: torch.device):
    """Modules a subclass keeps besides the model (a frozen reference model for a DPO-style loss, ...) go to
    this worker's device, frozen and in eval mode: they are never wrapped, optimised or saved."""
    for name, value in vars(trainer).items():
        if isinstance(value, torch.nn.Module) and name not in ("model", "model_wrapped"):
            value.to(device).eval().requires_grad_(False)


def ray_worker_main(config: Dict[str, Any]):
    """Entry point given to Ray Train's TorchTrainer as `train_loop_per_worker`: serve the driver's jobs, in
    order, until the job board closes (`close()`, the idle timeout; see coordinator/jobs.py). The process,
    its process group and imports stay between jobs; each job brings its own copy of the trainer."""
    import ray

    ctx = WorkerContext.from_ray()
    sink = config["sink"]
    keep_freed_memory()  # no page faults for what each step frees and allocates again (worker/memory.py)
    quiet_wrapped_tracebacks()  # a job's error reaches the driver as one line (user_errors.py)
    last = None
    while True:
        try:
            posted = ray.get(sink.next_job.remote(last, ctx.rank, ctx.world_size))
        except ray.exceptions.RayActorError:  # the driver released the group (or is gone): nothing to serve
            return
        if posted is None:
            return
        last = posted.id
        try:
            serve(posted, ctx, sink)
        except ray.exceptions.RayActorError:
            if sink_alive(sink):
                raise
            # The sink went with its driver while this job ran (Tune ended a trial's actor at the sweep's end, the
            # script exited): nobody is left to report to, and a traceback here would be noise on the console.
            return
        release_memory(ctx)


def sink_alive(sink) -> bool:
    """Whether the job board's sink still answers (a RayActorError from a job may be the user's own actor's)."""
    import ray

    try:
        ray.get(sink.controller.remote(), timeout=10)
    except ray.exceptions.RayActorError:
        return False
    except ray.exceptions.GetTimeoutError:  # alive but slow to answer: not a dead driver
        pass
    return True


def serve(posted: Job, ctx: WorkerContext, sink):
    """Run one job from the board; rank 0 hands its result to the sink."""
    import ray

    from .. import code_paths, transfer

    startup = Timeline()  # the job received: the start-up's worker side begins (startup.py)
    emitter = Emitter(sink, ctx.rank, job=posted.id)

    def reported(exc: Exception, fatal: bool = False) -> WorkerError:
        """`exc` as this job's WorkerError, its traceback sent to the driver first (call from its except block)."""
        error = WorkerError.of(exc, ctx.rank, posted.job_kind, fatal=fatal, job=posted.id)
        emitter.emit(ERROR, traceback=error.worker_traceback)
        emitter.flush(wait=True)
        return error

    try:
        code_paths.install(posted.code, fetch=ray.get)  # what the driver imports, importable here too
        # The weights and large data come from the object store (zero-copy on the driver's node).
        trainer, order = transfer.unpack(posted.payload, ray.get(posted.data))
    except Exception as exc:  # a module this node lacks: every try would fail alike, so the job fails now
        raise reported(exc, fatal=True) from None
    configure_worker(order.log_levels.for_rank(ctx.rank))
    try:
        startup.mark("unpack")
        result = run_job(trainer, order, ctx, emitter, on_ray=True, startup=startup, taken_at=posted.taken_at)
    except Exception as exc:  # the user's error, as one line on the driver (the traceback travels with it)
        raise reported(exc) from None
    except BaseException:
        emitter.emit(ERROR, traceback=traceback.format_exc())
        emitter.flush(wait=True)
        raise
    emitter.flush(wait=True)
    if ctx.is_main:
        # the weights of a train job (TrainResult, or a hosted train()'s HostedResult)
        shared = getattr(result, "model_state", None) is not None
        if shared:  # the trained weights go into the object store once; the driver maps them
            result = dataclasses.replace(result, model_state=transfer.put_state(result.model_state))
        emitter.set_result(result)
        if shared:
            # This worker owns that object (Ray 2.56 removed `ray.put(_owner=...)`): it is lost if the worker
            # dies, so stay until the driver has copied the weights into its model.
            emitter.wait_result_taken()


def release_memory(ctx: WorkerContext):
    """Between jobs a worker holds no model, optimizer or data: an idle group costs its processes and their
    CUDA context, not the last job's memory."""
    gc.collect()
    give_back_freed_memory()
    if ctx.device.type == "cuda":
        torch.cuda.empty_cache()
