"""The Python API of the hosted mode: any `transformers.Trainer` subclass, built on every Ray worker.

    trainer = SFTTrainer(model=model, args=SFTConfig(...), train_dataset=ds)                   # before
    trainer = raytrainer.hosted(SFTTrainer, num_workers=2)(model=model, args=SFTConfig(...),
                                                           train_dataset=ds)                   # after
    trainer.train(); trainer.evaluate(); trainer.predict(test); trainer.save_model()

`hosted(cls, **options)` takes the trainer class (or a function that builds one) and raytrainer's options
(hosting/options.py); calling it with the class's own constructor arguments gives a `HostedTrainer`. Nothing is
built on the driver: each call ships the class and its arguments (their tensors and datasets through the
object store), and every rank builds the trainer, so accelerate sets it up for the worker group's process
group. The arguments object (`SFTConfig`, `Seq2SeqTrainingArguments`, ...) is rebuilt on each rank from its
fields: one shipped as it is would carry the driver's one-process accelerate state, and every rank would
train alone. Callbacks given to the constructor run on the driver (one event stream, HF's signatures) unless
they say `on_every_rank = True`.

After train() the driver's model holds the trained weights (as with HF's Trainer in one process); when the
trainer wraps the model on the workers (a PEFT adapter, say), the weights are kept here and loaded into the
next call's trainer instead.
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import uuid
from typing import Any, Callable, Optional

import torch

from .. import storage
from ..arguments.training_args import TrainingArguments as RaytrainerArguments
from ..callbacks.base import CallbackMethods
from ..checkpoint.model_io import load_into
from ..coordinator import holders
from ..errors import ConfigError
from ..protocol import HostedCall, HostedOrder, HostedResult, LogLevels
from ..state import TrainerState
from ..storage.urls import absolute_if_local, local_path
from ..transfer import SharedState, fetch_state
from ..verbosity import notice, quiet_driver, worker_level
from .callbacks import driver_callbacks
from .dispatch_order import dispatch_order
from .hosted_handler import HostedHandler
from .interrupted import stop_if_interrupted
from .options import HostedOptions, hosted_options, misplaced


def hosted(trainer: Any, **options: Any) -> Callable[..., "HostedTrainer"]:
    """`trainer`: a `transformers.Trainer` subclass (TRL's SFTTrainer, Seq2SeqTrainer, your own), or a function
    returning a Trainer (called on every rank). `options`: raytrainer's (num_workers, max_failures,
    storage_options, report_to, resume, ...). Returns what builds the hosted trainer from the class's own
    constructor arguments."""
    _check_target(trainer)
    checked = hosted_options(options, f"hosted({_name(trainer)}, ...)")

    def build(*trainer_args: Any, **trainer_kwargs: Any) -> HostedTrainer:
        return HostedTrainer(trainer, trainer_args, trainer_kwargs, checked, given_options=frozenset(options))

    build.__name__ = f"hosted({_name(trainer)})"
    return build


class HostedTrainer(CallbackMethods):
    def __init__(self, factory: Any, args: tuple, kwargs: dict, options: HostedOptions,
                 given_options: frozenset = frozenset()):
        misplaced_options = misplaced(kwargs)
        if misplaced_options:
            raise ConfigError(f"{', '.join(misplaced_options)} given to {_name(factory)}: they are raytrainer's "
                              f"options and go beside it: raytrainer.hosted({_name(factory)}, "
                              f"{misplaced_options[0]}=...)(...).")
        self.factory, self.options = factory, options
        quiet_driver(options)
        kwargs = dict(kwargs)
        args = list(args)
        self.args = _trainer_arguments(factory, args, kwargs)
        callbacks = kwargs.pop("callbacks", None) or []
        on_ranks = [c for c in callbacks if getattr(c, "on_every_rank", False)]
        if on_ranks:
            kwargs["callbacks"] = on_ranks
        self._call_args, self._call_kwargs = tuple(args), kwargs
        given = kwargs.get("model", args[0] if args else None)  # HF's signature: (model, args, ...)
        self.model = given if isinstance(given, torch.nn.Module) else None
        self._trained = None  # weights of the last train() that could not go into self.model (see module doc)
        self.callback_handler = driver_callbacks(options, self.args, given_options,
                                                 [c for c in callbacks if c not in on_ranks])
        self.state = self.callback_handler.state
        self.reporters_named = "report_to" in given_options
        self._pool_user = holders.PoolUser(owner=f"hosted({_name(factory)})")

    # ------------------------------------------------------------------ HF's methods
    def train(self, resume_from_checkpoint=None, **kwargs) -> Any:
        result = self._dispatch("train", (), {"resume_from_checkpoint": resume_from_checkpoint, **kwargs},
                           receive=self._receive_weights)
        stop_if_interrupted(result, "train() again continues from it", self.callback_handler)
        if result.runs:
            run_record = result.runs[-1]
            self.state = TrainerState.from_json_string(run_record["state"])  # rank 0's, best named by its URL
            self.state.log_history = list(run_record["log_history"])
            self.callback_handler.state = self.state
        return result.value

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval") -> dict:
        return self._dispatch("evaluate", (), {"eval_dataset": eval_dataset, "ignore_keys": ignore_keys,
                                          "metric_key_prefix": metric_key_prefix}).value

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix: str = "test") -> Any:
        return self._dispatch("predict", (test_dataset,), {"ignore_keys": ignore_keys,
                                                      "metric_key_prefix": metric_key_prefix}).value

    def save_model(self, output_dir: Optional[str] = None):
        """HF's save_model on the workers (the process that saves writes; a URL is uploaded)."""
        self._dispatch("save_model", (), {"output_dir": output_dir})

    def close(self):
        """Release the worker group of the last call now (else it stays in the pool: coordinator/holders.py)."""
        self._pool_user.release()

    def __enter__(self) -> "HostedTrainer":
        return self

    def __exit__(self, *exc) -> bool:
        self.close()
        return False

    # ------------------------------------------------------------------ internals
    def _dispatch(self, method: str, call_args: tuple, call_kwargs: dict, receive=None) -> HostedResult:
        run_id = uuid.uuid4().hex[:12]
        handler = self.callback_handler
        arguments = self.args
        target = HostedCall(self.factory, self._call_args, self._call_kwargs,
                            args_class=type(arguments) if arguments is not None else None,
                            args_fields=_fields(arguments) if arguments is not None else None,
                            call_args=call_args, call_kwargs=call_kwargs, trained_state=self._trained)
        target.modules = _modules((self._call_args, self._call_kwargs))  # found at any depth (transfer.py)
        order = HostedOrder(
            run_id=run_id, method=method, resume=self.options.resume, storage_options=self.options.storage_options,
            callback_decisions=self.options.callback_decisions, control_points=handler.control_points(),
            hang_warning_s=self.options.hang_warning_s, hang_timeout_s=self.options.hang_timeout_s,
            heard=handler.heard(),
            log_levels=LogLevels(rank0=worker_level(self.options, 0, driver_ran_model=True),
                                 replica=worker_level(self.options, 1, driver_ran_model=True)))
        claims = HostedHandler(handler, run_id, self.options.resume, self.options.storage_options,
                               self.reporters_named)
        early = _output_url(arguments) if method == "train" else None
        try:
            if early is not None:
                # The arguments are here: the storage is probed and the lease taken before any worker starts, so a
                # second driver on this output_dir, bad credentials or an unreachable endpoint is one message at
                # once. Rank 0's claim then finds it taken by this job.
                claims.take(early)
            return dispatch_order(target, order, self.options, handler, claims, self._pool_user, receive=receive)
        finally:
            claims.close()  # the leases, also when Ray's start or the packing failed

    def _receive_weights(self, result: HostedResult) -> HostedResult:
        """The trained weights into the driver's model (or kept for the next call), while they still exist."""
        state = result.model_state
        if state is None:
            return result
        if isinstance(state, SharedState):
            state = fetch_state(state)
        if self.model is not None:
            try:
                load_into(self.model, state)
                self._trained = None
                return dataclasses.replace(result, model_state=None)
            except RuntimeError:  # the workers' trainer wrapped the model (a PEFT adapter): keep the weights
                pass
        self._trained = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
        return dataclasses.replace(result, model_state=None)


def _check_target(trainer: Any):
    import transformers

    if isinstance(trainer, transformers.Trainer):
        raise ConfigError(
            f"hosted() got a {type(trainer).__name__} instance, built on the driver: it would carry the driver's "
            "one-process set-up to every worker. Pass the class and its arguments instead: "
            f"raytrainer.hosted({type(trainer).__name__}, num_workers=...)(model=..., args=..., ...).")
    if inspect.isclass(trainer):
        if not issubclass(trainer, transformers.Trainer):
            raise ConfigError(f"hosted({trainer.__name__}): not a transformers.Trainer subclass. raytrainer's own "
                              "Trainer runs on Ray by itself: raytrainer.Trainer(...).train().")
        return
    if not callable(trainer):
        raise ConfigError(f"hosted() takes a transformers.Trainer subclass or a function returning a Trainer, got "
                          f"{type(trainer).__name__}.")


def _trainer_arguments(factory: Any, args: list, kwargs: dict):
    """The trainer's arguments object (kwargs["args"], or the second positional argument, as HF's signature
    has it), taken out: it is rebuilt on each rank. raytrainer's own TrainingArguments is refused."""
    import transformers

    if "args" in kwargs:
        value = kwargs.pop("args")
    elif len(args) > 1 and isinstance(args[1], (transformers.TrainingArguments, RaytrainerArguments)):
        value = args.pop(1)
    else:
        return None
    if isinstance(value, RaytrainerArguments):
        raise ConfigError(
            f"args=raytrainer.TrainingArguments given to {_name(factory)}, which takes transformers' arguments "
            "(its own config class: SFTConfig, DPOConfig, Seq2SeqTrainingArguments, ..., or "
            "transformers.TrainingArguments). Build that, and give raytrainer's options beside the trainer: "
            f"raytrainer.hosted({_name(factory)}, num_workers=2)(args=..., ...).")
    if value is not None and not isinstance(value, transformers.TrainingArguments):
        raise ConfigError(f"args={type(value).__name__}: {_name(factory)} takes a transformers.TrainingArguments "
                          "(or its own subclass of it).")
    return value


def _fields(arguments) -> dict:
    """What rebuilds `arguments` on a rank: its init fields as they are now, less those its `__post_init__`
    derived from the driver's one process (see `_undo_one_process`). Checked here by building it once."""
    fields = {f.name: getattr(arguments, f.name) for f in dataclasses.fields(arguments)
              if f.init and hasattr(arguments, f.name)}
    _undo_one_process(fields)
    try:
        type(arguments)(**fields)
    except Exception as exc:  # noqa: BLE001 (whatever its __post_init__ raises)
        raise ConfigError(
            f"{type(arguments).__name__} cannot be rebuilt from its fields on the workers ({type(exc).__name__}: "
            f"{exc}). Give hosted() a function that builds the trainer and its arguments instead of the class: "
            "it runs on every rank.") from exc
    return fields


def _undo_one_process(fields: dict):
    """TRL's online trainers (GRPO, RLOO) derive one of `generation_batch_size` and `steps_per_generation` from the
    other and the number of processes, which was 1 on the driver, so that both are set by now. The per-rank one
    (`steps_per_generation`) is kept and the total derived again on each rank for the group's size; when it is
    not the default (gradient_accumulation_steps), the user may have set the total instead: say so."""
    total, steps = fields.get("generation_batch_size"), fields.get("steps_per_generation")
    if total is None or steps is None:
        return
    fields["generation_batch_size"] = None
    if steps != fields.get("gradient_accumulation_steps", 1):
        notice(f"steps_per_generation={steps} is kept and generation_batch_size is derived again on each rank for "
               "the worker group's size. If you set generation_batch_size yourself, build the config inside a "
               "function given to hosted() (it runs on every rank).")


def _output_url(arguments) -> Optional[str]:
    """The output_dir rank 0 will claim, when the driver can tell it: a URL or an absolute path (a relative one
    is the worker's to resolve, and is claimed there)."""
    output_dir = getattr(arguments, "output_dir", None)
    if not output_dir:
        return None
    output_dir = str(output_dir)
    if storage.is_local(output_dir) and not os.path.isabs(local_path(output_dir)):
        return None
    return absolute_if_local(output_dir)  # as the worker names it (worker/hosted/host.py url_for)


def _modules(value, depth: int = 6) -> list:
    """The torch modules inside the trainer's constructor arguments (in lists and dicts too)."""
    if depth < 0:
        return []
    if isinstance(value, torch.nn.Module):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [m for item in value for m in _modules(item, depth - 1)]
    return []


def _name(trainer: Any) -> str:
    return getattr(trainer, "__name__", type(trainer).__name__)
