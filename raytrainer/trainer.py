"""`Trainer`: the driver-side API. Hugging Face's constructor and methods; the work runs on Ray.

`train()`, `evaluate()` and `predict()` check everything here (`preflight/`), then ship the trainer (with any
user subclass) and a work order (`protocol.TrainOrder`, `EvaluateOrder`, `PredictOrder`) to a Ray Train worker
group, or run the same code in this process when num_workers=0; rank 0's result comes back typed
(`protocol.TrainResult`, ...). The hooks that run on the workers are inherited from `WorkerHooks`.

What the other layers see of a Trainer: the coordinator gets the run's `RunSpec` (built once per call from its
arguments), its callback handler and `holders.PoolUser` (its last worker group) as arguments of
`dispatch.dispatch_job`; the training loop reaches it through
its HF attributes and hooks, and sets `micro_step` and `training_run` while it runs (`worker/run_link.py`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import uuid
from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch

from . import preflight, storage, transfer
from .arguments.checks import check_arguments_object
from .arguments.training_args import TrainingArguments
from .callbacks.base import CallbackHandler, CallbackMethods
from .callbacks.progress import PrinterCallback, ProgressCallback
from .callbacks.reporters import reporter_callbacks
from .callbacks.stateful import restore_states
from .checkpoint import lease, resume
from .checkpoint.listing import read_trainer_state
from .checkpoint.model_io import load_into, save_model_files
from .coordinator import cluster, dispatch, holders
from .coordinator.handlers import JobHandlers
from .coordinator.spec import RunSpec, decide_use_gpu
from .data import ray_data
from .errors import ConfigError
from .hub import push as hub
from .hub.model_card import ModelCardMixin
from .metrics_files import MetricsFilesMixin
from .optimizers import check_optimizer_cls_and_kwargs
from .protocol import EvaluateOrder, LogLevels, PredictOrder, TrainOrder, TrainResult, WorkOrder
from .startup import Startup
from .startup_line import StartupLine
from .state import PredictionOutput, TrainerState, TrainOutput
from .storage.upload import upload_dir
from .verbosity import quiet_driver, worker_level
from .worker.evaluation import eval_sets
from .worker.hooks import WorkerHooks
from .worker_context import WorkerContext


class Trainer(MetricsFilesMixin, ModelCardMixin, hub.HubMixin, CallbackMethods, WorkerHooks):
    # A resume keeps the arguments' optimizer hyperparameters, not the checkpoint's: set on a PBT trial's Trainer,
    # which continues another trial's checkpoint with its own learning rate (tune/trial.py).
    _own_hyperparameters = False
    # A hyperparameter search's trial: its values and its hp_name (tune/trial.py), recorded in the run's state as
    # transformers records them (is_hyper_param_search, trial_params, trial_name).
    _trial: Optional[dict] = None
    _trial_name: Optional[str] = None

    def __getattr__(self, name: str):
        # Reached only for an attribute the Trainer lacks: one of transformers' internal steps, called by a subclass
        # written for transformers, gets the ways on instead of a bare AttributeError.
        if name in preflight.overrides.HF_ONLY:
            raise preflight.overrides.not_here(type(self).__name__, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __init__(self, model: Optional[torch.nn.Module] = None, args: Optional[TrainingArguments] = None,
                 data_collator: Optional[Callable] = None, train_dataset=None,
                 eval_dataset: Union[Any, Dict[str, Any], None] = None, processing_class=None,
                 model_init: Optional[Callable[[], torch.nn.Module]] = None,
                 compute_loss_func: Optional[Callable] = None, compute_metrics: Optional[Callable] = None,
                 callbacks: Optional[list] = None, optimizers=(None, None),
                 optimizer_cls_and_kwargs: Optional[Tuple[type, Dict[str, Any]]] = None,
                 preprocess_logits_for_metrics: Optional[Callable] = None):
        preflight.launchers.check_not_launched()  # under torchrun & co: refuse in every process, before Ray starts
        preflight.overrides.check_overrides(type(self), Trainer)  # an HF-only method overridden would never run
        if model is None and model_init is None:
            raise ConfigError("Trainer needs a model: pass model=... or model_init=<a function returning one>.")
        if model is not None and not isinstance(model, torch.nn.Module):
            raise ConfigError(f"model must be a torch.nn.Module, got {type(model).__name__}.")
        self.args = args if args is not None else TrainingArguments()
        check_arguments_object(self.args, TrainingArguments)  # transformers' own class: refused, naming ours
        quiet_driver(self.args)
        self.model = model
        self.model_init = model_init
        self.data_collator = data_collator
        self.train_dataset = train_dataset
        self.eval_dataset = eval_dataset
        self.processing_class = processing_class
        self.compute_loss_func = compute_loss_func
        self.compute_metrics = compute_metrics
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.optimizer, self.lr_scheduler = optimizers
        self.optimizer_cls_and_kwargs = check_optimizer_cls_and_kwargs(optimizer_cls_and_kwargs, self.optimizer)
        self.state = TrainerState()
        self.ctx = WorkerContext()  # the driver's view until a worker sets its own
        self.model_wrapped = model
        self.strategy = None
        progress = PrinterCallback if self.args.disable_tqdm else ProgressCallback
        self.callback_handler = CallbackHandler([progress()], self.args, self.state)
        for reporter in reporter_callbacks(self.args):  # report_to: tensorboard, mlflow, ...
            self.add_callback(reporter)
        for callback in callbacks or []:
            self.add_callback(callback)
        self.callback_handler.context = {"model": model, "processing_class": processing_class}
        # The worker group of the last call, from the process's pool, and how the groups name this Trainer.
        self._pool_user = holders.PoolUser(owner=f"the Trainer created at {_caller_site()}")
        self.callback_handler.handle({"kind": "init_end"})

    # ------------------------------------------------------------------ pickling to the workers
    def __getstate__(self):
        state = self.__dict__.copy()
        for name in transfer.DRIVER_ONLY + hub.DRIVER_ONLY:  # callbacks run on the driver, from the event stream
            state.pop(name, None)
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    # ------------------------------------------------------------------ the worker group's life
    def close(self):
        """Release the worker group this Trainer used last (its actors, GPUs and CPUs) now, unless another
        Trainer has used it since; a later call takes another idle group or starts a new one. Also done by
        `with Trainer(...) as trainer:`. Without it, the group stays in the process's pool for the next call
        of any Trainer, until worker_idle_timeout_s without a call or interpreter exit (coordinator/holders.py)."""
        self._pool_user.release()

    @property
    def _group(self):
        """The worker group of the last call (None before any, and after close())."""
        return self._pool_user.group

    def __enter__(self) -> "Trainer":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    # ------------------------------------------------------------------ public API
    def train(self, resume_from_checkpoint: Union[str, bool, None] = None, **kwargs) -> TrainOutput:
        if kwargs:
            raise ConfigError(f"train() got unexpected arguments {sorted(kwargs)}.")
        args = self.args
        startup = Startup()  # train()'s start-up timeline: logged at the first step, kept in the state (startup.py)
        with StartupLine(startup, enabled=not args.disable_tqdm):  # what start-up waits for, until the first event
            return self._train(startup, resume_from_checkpoint)

    def _train(self, startup: Startup, resume_from_checkpoint: Union[str, bool, None]) -> TrainOutput:
        args = self.args
        preflight.inputs.check_train_inputs(self)
        hub.check_reachable(self)  # push_to_hub: the repository exists and we may write it, before any worker
        ray_datasets = self._ray_datasets()  # their steps' CPUs are checked below
        if ray_datasets:  # the loss check below reads two rows of it (other inputs need no Ray yet)
            startup.doing = "connecting to Ray"
            self._connect(*ray_datasets)
            preflight.placement.make_room_for_data(ray_datasets)  # for its read: no idle group holds its CPUs
        startup.doing = "the 2-sample loss check"
        startup.loss_check_s = preflight.loss.check_loss(self, self.train_dataset, "train_dataset")
        startup.doing = "connecting to Ray"
        self._connect()
        startup.doing = "checking placement and storage"
        use_gpu = self._use_gpu()  # the cluster's GPUs (Ray connected), or CUDA here for num_workers=0
        preflight.placement.check_placement(args, use_gpu, ray_datasets)
        preflight.placement.check_output_dir(args)
        resume_url = self._resolve_resume(resume_from_checkpoint if resume_from_checkpoint is not None
                                          else args.resume_from_checkpoint)
        # The checkpoint's trainer_state.json, read once: preflight checks its global batch, callbacks restore from it.
        resume_state = None if resume_url is None else read_trainer_state(resume_url, args.storage_options) or {}
        preflight.strategy.check_strategy_and_precision(self, use_gpu, resume_url, resume_state)
        if resume_url is not None and args.restore_callback_states_from_checkpoint:
            restore_states(self.callback_handler, resume_state.get("stateful_callbacks") or {})
        run_id = uuid.uuid4().hex[:12]
        self.state = TrainerState()
        if resume_state:  # as transformers' state after a resume: the checkpoint's log history, then this run's
            self.state.log_history = list(resume_state.get("log_history") or [])
        self.callback_handler.state = self.state
        # One writer per output_dir: taken before any actor starts, released when the run ends (lease.py).
        with lease.acquire(args.output_dir, run_id, args.storage_options), hub.checkpoint_pushes(self):
            order = TrainOrder(run_id=run_id, resume_from=resume_url, own_hyperparameters=self._own_hyperparameters,
                               **self._worker_settings())
            result = self._dispatch(order, receive=self._receive_trained_weights, startup=startup)
        self.state = TrainerState.from_json_string(result.state)
        self.callback_handler.state = self.state
        if result.interrupted:  # Ctrl-C: the run saved at a step boundary and ended
            print(f"[raytrainer] stopped at step {self.state.global_step} with a committed checkpoint; "
                  "train(resume_from_checkpoint=True) continues", flush=True)
            raise KeyboardInterrupt
        return result.train_output

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict:
        if self.training_run is not None:  # inside a run on a worker: the loop's evaluation (an override's super())
            return self.training_run.evaluate_here(eval_dataset, ignore_keys, metric_key_prefix)
        dataset = self.eval_dataset if eval_dataset is None else eval_dataset
        if dataset is None:
            raise ConfigError("evaluate() needs an eval dataset: pass Trainer(eval_dataset=...) or "
                              "evaluate(eval_dataset=...).")
        datasets = eval_sets(dataset, metric_key_prefix)
        metrics = {}
        for index, (prefix, ds) in enumerate(datasets):
            preflight.inputs.check_dataset(ds, "eval_dataset")
            self._connect(ds)
            result = self._dispatch(EvaluateOrder(dataset=ds, prefix=prefix, ignore_keys=ignore_keys,
                                             **self._worker_settings()))
            # As HF, for each dataset: its metrics are logged (log_history, on_log), then on_evaluate.
            self.log(result.metrics)  # on the driver: to its callbacks and log_history (an override sees it)
            self.callback_handler.handle({"kind": "evaluate", "metrics": result.metrics,
                                          "eval_datasets_left": len(datasets) - 1 - index})
            metrics.update(result.metrics)
        return metrics

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix: str = "test") -> PredictionOutput:
        preflight.inputs.check_dataset(test_dataset, "test_dataset")
        self._connect(test_dataset)
        result = self._dispatch(PredictOrder(dataset=test_dataset, prefix=metric_key_prefix, ignore_keys=ignore_keys,
                                        **self._worker_settings()))
        output = result.prediction
        self.callback_handler.handle({"kind": "predict", "metrics": output.metrics})
        return output

    def hyperparameter_search(self, hp_space: Optional[Callable[[Any], Dict[str, Any]]] = None,
                              compute_objective: Optional[Callable[[Dict[str, float]], float]] = None,
                              n_trials: int = 20, direction: str = "minimize", backend=None,
                              hp_name: Optional[Callable[[Any], str]] = None, **kwargs):
        """transformers' hyperparameter search on Ray Tune, each trial a raytrainer run on its own worker group in
        output_dir/run-<trial id>; `**kwargs` go to Tune as transformers passes them to `tune.run`. Returns
        transformers' `BestRun(run_id, objective, hyperparameters, run_summary)` (docs/tune.md, tune/search.py)."""
        from .tune.search import hyperparameter_search

        return hyperparameter_search(self, hp_space, compute_objective, n_trials, direction, backend, hp_name,
                                     **kwargs)

    def save_model(self, output_dir: Optional[str] = None, _internal_call: bool = False):
        """Save the model (its save_pretrained format, else model.safetensors) to a local path or URL. With
        args.push_to_hub, output_dir then goes to the Hub, as in transformers (hub/push.py)."""
        output_dir = storage.absolute_if_local(output_dir or self.args.output_dir)
        model = self._driver_model()
        if storage.is_local(output_dir):
            self._save(storage.local_path(output_dir), model=model)
        else:
            import tempfile

            with tempfile.TemporaryDirectory() as staging:
                self._save(staging, model=model)
                upload_dir(staging, output_dir, self.args.storage_options)  # file by file: never creates a bucket
        if getattr(self.args, "push_to_hub", False) and not _internal_call:
            self.push_to_hub(commit_message="Model save", revision=getattr(self.args, "hub_revision", None))

    def _save(self, output_dir: str, state_dict: Optional[dict] = None, model=None):
        """Write the model files into a local directory (HF's hook name; a subclass may add files)."""
        save_model_files(model if model is not None else self._driver_model(), output_dir, state_dict)
        if self.processing_class is not None and hasattr(self.processing_class, "save_pretrained"):
            self.processing_class.save_pretrained(output_dir)

    # ------------------------------------------------------------------ internals
    def _connect(self, *datasets):
        """Join (or start) Ray when workers are needed, or when a Ray Dataset is read (also in process)."""
        if self.args.max_workers > 0 or any(ray_data.is_ray_dataset(d) for d in datasets):
            cluster.connect(self.args.ray_address)

    def _datasets(self) -> list:
        evals = self.eval_dataset.values() if isinstance(self.eval_dataset, dict) else [self.eval_dataset]
        return [self.train_dataset, *evals]

    def _ray_datasets(self) -> list:
        return [d for d in self._datasets() if ray_data.is_ray_dataset(d)]

    def _use_gpu(self) -> bool:
        return decide_use_gpu(self.args.use_gpu, self.args.max_workers)

    def _resolve_resume(self, requested: Union[str, bool, None]) -> Optional[str]:
        """True: the newest intact committed checkpoint under output_dir; a path/URL: that one, if committed and
        intact (checked against its manifest's checksums: checkpoint/resume.py)."""
        return resume.resolve(self.args.output_dir, requested, self.args.storage_options)

    def _worker_settings(self) -> dict:
        """What every work order carries of the driver's set-up, as it is now: the events its callbacks decide on
        and those they listen to, the callbacks that run on every rank, the workers' log levels (verbosity.py)."""
        handler = self.callback_handler
        return {"control_points": handler.control_points(), "heard": handler.heard(),
                "rank_callbacks": tuple(handler.rank_callbacks),
                "log_levels": LogLevels(rank0=worker_level(self.args, 0, driver_ran_model=self.model is not None),
                                        replica=worker_level(self.args, 1, driver_ran_model=True))}

    def _dispatch(self, order: WorkOrder, receive: Optional[Callable[[Any], Any]] = None,
             startup: Optional[Startup] = None) -> Any:
        """Run `order` on the workers (or here: coordinator/dispatch.py); rank 0's result (`protocol.TrainResult`,
        ...) as `receive(result)` returns it, which runs while the result's objects still exist. `startup`:
        train()'s start-up timeline, its driver phases marked here and in the coordinator."""
        # The pickle carries no weights or large data: those go to the object store once (transfer.py).
        # A ray.data.Dataset goes beside the pickle, each job splits its own (data/ray_data.py).
        with ray_data.detached(self, order) as (order, datasets):
            if startup is not None:
                startup.driver.mark("preflight")
            packed = transfer.pack_job(self, order)
            if startup is not None:
                startup.driver.mark("pack")
        # Built after preflight, which may lower resources_per_worker to leave CPUs for Ray Data (placement.py).
        spec = RunSpec.of_arguments(self.args, use_gpu=self._use_gpu())
        return dispatch.dispatch_job(packed, order.job_kind, spec=spec, handlers=JobHandlers(self.callback_handler),
                                     user=self._pool_user, datasets=datasets, receive=receive, startup=startup)

    def _driver_model(self) -> torch.nn.Module:
        if self.model is None:
            self.model = self.model_init()
        return self.model

    def _receive_trained_weights(self, result: TrainResult) -> TrainResult:
        self._load_trained_weights(result.model_state)
        model = self._driver_model()
        if self.args.gradient_checkpointing and hasattr(model, "gradient_checkpointing_enable") and getattr(
                model, "supports_gradient_checkpointing", True):  # as transformers' train() leaves the model
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=self.args.gradient_checkpointing_kwargs)
        return dataclasses.replace(result, model_state=None)  # the weights are the model's now

    def _load_trained_weights(self, model_state):
        """Copy the trained weights into the driver's model: a state dict (in-process), or one in the object
        store (`transfer.SharedState`), read from shared memory without an intermediate copy."""
        model = self._driver_model()
        if isinstance(model_state, transfer.SharedState):
            model_state = transfer.fetch_state(model_state)
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        load_into(model, {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in model_state.items()})
        self.model_wrapped = model


def _caller_site() -> str:
    """file:line of the user's code that built the Trainer (named when its worker group holds resources)."""
    package = os.path.dirname(os.path.abspath(__file__))
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"
