"""The function every Ray Train worker runs (and the driver, for num_workers=0).

A worker serves the jobs of its Trainer's worker group, one after the other (`coordinator/group.py`). For each
one the driver ships the whole `Trainer` (pickled once, with cloudpickle, so a user's subclass and its hooks
come along; its weights and large data through the object store, see `transfer.py`); each worker rebuilds
its own copy, runs the requested job, and rank 0 hands the result to the event sink (the trained weights
as an object in the store).
"""

from __future__ import annotations

import gc
import traceback
from typing import Any, Dict, Optional

from ..callbacks.channel import Emitter
from ..protocol import ERROR, Job, JobKind
from ..startup import Timeline
from ..verbosity import configure_worker
from ..worker_context import WorkerContext
from .evaluation import evaluation_loop
from .loop import TrainLoop
from .loop_events import LoopEvents
from .memory import give_back_freed_memory, keep_freed_memory
from .process_options import setup_process
from .user_errors import WorkerError, quiet_wrapped_tracebacks


def run_job(trainer, job: Dict[str, Any], ctx: WorkerContext, emitter: Emitter, on_ray: bool = False,
            startup: Optional[Timeline] = None, taken_at: Optional[float] = None) -> Any:
    """`startup`: a train job's start-up timeline on this rank, from the job's receipt (`startup.py`);
    `taken_at`: the sink's stamp of rank 0 taking the job."""
    trainer.ctx = ctx
    trainer._place_auxiliary_modules()
    events = LoopEvents(trainer, ctx, emitter, job.get("control_points", ()), job.get("rank_callbacks", ()),
                        next_step=trainer.args.callback_decisions == "next_step")
    kind = JobKind(job["kind"])
    if kind is JobKind.TRAIN:
        loop = TrainLoop(trainer, ctx, emitter, events, job["run_id"], job.get("resume_from"), on_ray=on_ray)
        loop.startup, loop.taken_at = startup, taken_at  # its set-up marks the rest and rank 0 reports them
        return loop.run()

    # evaluate / predict: the model as the driver holds it, on this worker's device, no wrapper needed.
    setup_process(trainer.args, ctx.device)  # seed or full_determinism, tf32, as for training
    model = trainer.model if trainer.model is not None else trainer.model_init()
    trainer.model = trainer.model_wrapped = model.to(ctx.device)
    dataset = job["dataset"]
    if kind is JobKind.EVALUATE:
        dataloader = trainer.get_eval_dataloader(dataset)
        output = evaluation_loop(trainer, dataloader, ignore_keys=job.get("ignore_keys"),
                                 metric_key_prefix=job["prefix"], on_step=events.emit)
        return {"metrics": output.metrics} if ctx.is_main else None
    output = evaluation_loop(trainer, trainer.get_test_dataloader(dataset),
                             prediction_loss_only=False, ignore_keys=job.get("ignore_keys"),
                             metric_key_prefix=job["prefix"], on_step=events.emit, keep_predictions=True)
    return {"prediction": output} if ctx.is_main else None


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
        serve(posted, ctx, sink)
        release_memory(ctx)


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
        trainer, job = transfer.unpack(posted.payload, ray.get(posted.data))
    except Exception as exc:  # a module this node lacks: every try would fail alike, so the job fails now
        raise reported(exc, fatal=True) from None
    levels = job.get("log_levels", {})
    configure_worker(levels.get(ctx.rank, levels.get("replica")))
    try:
        startup.mark("unpack")
        result = run_job(trainer, job, ctx, emitter, on_ray=True, startup=startup, taken_at=posted.taken_at)
    except Exception as exc:  # the user's error, as one line on the driver (the traceback travels with it)
        raise reported(exc) from None
    except BaseException:
        emitter.emit(ERROR, traceback=traceback.format_exc())
        emitter.flush(wait=True)
        raise
    emitter.flush(wait=True)
    if ctx.is_main:
        shared = result is not None and "model_state" in result
        if shared:  # the trained weights go into the object store once; the driver maps them
            result["model_state"] = transfer.put_state(result.pop("model_state"))
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
        import torch

        torch.cuda.empty_cache()
