"""Checks run on the driver before any actor starts (principle 4: fail before spending).

Each failure is a `ConfigError` that names the problem and the fix.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

import cloudpickle
import torch

from . import optimizers
from .data.columns import LABEL_ALIASES, count_label_items, dataset_columns, dropped_label_columns
from .data.ray_data import check_train_length, is_ray_dataset, sample_rows
from .errors import ConfigError
from .startup import Startup

DRIVER_ONLY = ("callback_handler", "_group", "_startup")


def check_dataset(dataset: Any, name: str):
    if dataset is None or is_ray_dataset(dataset):  # a Ray Dataset streams; its length may be unknown
        return
    if isinstance(dataset, torch.utils.data.IterableDataset) or not hasattr(dataset, "__getitem__"):
        raise ConfigError(f"{name} must be a map-style dataset (datasets.Dataset or a torch Dataset with "
                          "__len__ and __getitem__); iterable datasets are not supported yet.")
    try:
        size = len(dataset)
    except TypeError as exc:
        raise ConfigError(f"{name} has no len(): use a map-style dataset.") from exc
    if size == 0:
        raise ConfigError(f"{name} is empty.")


def check_inputs(trainer, training: bool):
    args = trainer.args
    if training:  # train()'s first step: its start-up timeline starts here (startup.py, coordinator/dispatch.py)
        trainer._startup = Startup()
        if trainer.train_dataset is None:
            raise ConfigError("train() needs a train_dataset: pass Trainer(train_dataset=...).")
        check_dataset(trainer.train_dataset, "train_dataset")
        if is_ray_dataset(trainer.train_dataset):
            check_train_length(trainer.train_dataset, args)
    if training:
        from .worker.nonfinite import POLICIES

        if getattr(args, "on_nonfinite_loss", "warn") not in POLICIES:
            raise ConfigError(f"on_nonfinite_loss={args.on_nonfinite_loss!r}: choose one of {', '.join(POLICIES)}.")
    if args.batch_eval_metrics:  # transformers checks this at Trainer construction
        from .worker.batch_metrics import check_compute_metrics

        check_compute_metrics(trainer.compute_metrics)
    if args.eval_strategy != "no" and trainer.eval_dataset is None:
        raise ConfigError(f"eval_strategy={args.eval_strategy!r} needs an eval_dataset: pass "
                          "Trainer(eval_dataset=...) or set eval_strategy='no'.")
    if training and args.neftune_noise_alpha is not None and trainer.model is not None:
        from .worker.neftune import input_embeddings

        try:
            input_embeddings(trainer.model)
        except ValueError as exc:
            raise ConfigError(f"{exc} Set neftune_noise_alpha=None.") from None
    evals = trainer.eval_dataset if isinstance(trainer.eval_dataset, dict) else {"": trainer.eval_dataset}
    for key, dataset in evals.items():
        check_dataset(dataset, f"eval_dataset[{key!r}]" if key else "eval_dataset")


def check_loss(trainer, dataset: Any, dataset_name: str):
    """Run the loss on two samples, on the driver, so a missing or dropped label column, a model that returns
    no loss, or a loss training cannot use (not a scalar, no gradient, NaN) fails here rather than in every
    worker. Skipped with model_init (no model object on the driver yet)."""
    model = trainer.model
    if model is None or dataset is None:
        return
    started = time.perf_counter()
    try:
        _check_loss(trainer, model, dataset, dataset_name)
    finally:
        startup = getattr(trainer, "_startup", None)
        if startup is not None:
            startup.loss_check_s = time.perf_counter() - started


def _check_loss(trainer, model, dataset: Any, dataset_name: str):
    rows = sample_rows(dataset) if is_ray_dataset(dataset) else [dataset[i] for i in range(min(2, len(dataset)))]
    batch = trainer._collator()(rows)
    _check_labels_kept(trainer, rows, batch, dataset_name)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    was_training = model.training
    items = count_label_items(batch, trainer.label_names)
    try:
        # With gradients on, to see that the loss reaches the parameters; the graph keeps none of the activations
        # backward would need (dropped as they are saved), so memory stays as under no_grad.
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(_drop, _drop):
            loss = trainer._call_compute_loss(model, batch, num_items_in_batch=items)
    except Exception as exc:
        raise ConfigError(_loss_failure(trainer, dataset, dataset_name, exc)) from exc
    finally:
        model.train(was_training)
    _check_loss_value(trainer, loss, dataset_name, items)


def _drop(_):
    return None


def _check_labels_kept(trainer, rows: list, batch: dict, dataset_name: str):
    """A label column the collator dropped (text: the default collator batches numbers only) would train a
    model without labels, or fail later as 'no loss'."""
    for name, example in dropped_label_columns(rows, batch, trainer.label_names):
        raise ConfigError(
            f"{dataset_name}'s {name!r} column holds {type(example).__name__} values (e.g. {example!r}), which the "
            "data collator dropped: the model would get no labels. Map them to numbers first (class ids: "
            f"dataset.class_encode_column({name!r}), or a label2id dict in dataset.map; token ids for text "
            "targets), or pass a data_collator that turns them into tensors.")


def _check_loss_value(trainer, loss: Any, dataset_name: str, items: Optional[int]):
    """What backward() and the optimizer need: a tensor, a scalar, a graph to the parameters, a finite value."""
    where = f"The loss on two samples of {dataset_name} (computed on the driver before any worker started)"
    source = "compute_loss_func" if trainer.compute_loss_func is not None else f"{type(trainer).__name__}.compute_loss"
    if not isinstance(loss, torch.Tensor):
        raise ConfigError(f"{where} is a {type(loss).__name__}, not a torch tensor: {source} must return the loss "
                          "tensor (a scalar computed from the model's outputs).")
    if loss.dim() != 0:
        raise ConfigError(f"{where} has shape {tuple(loss.shape)}, not a scalar: reduce it in {source} (.mean() "
                          "over its items, or .sum() / num_items_in_batch) so that backward() gets one number.")
    if not loss.requires_grad:
        frozen = not any(p.requires_grad for p in trainer.model.parameters())
        why = (f"no parameter of {type(trainer.model).__name__} requires grad: unfreeze the ones to train "
               "(param.requires_grad_(True))" if frozen else
               f"{source} cut it off the model's parameters: do not .detach() it, call .item() on it or compute it "
               "under torch.no_grad(), and build it from the model's outputs")
        raise ConfigError(f"{where} does not require grad, so training could not update anything: {why}.")
    value = float(loss.detach())
    if not torch.isfinite(loss.detach()) and items != 0:  # no label item in these rows: a 0/0 is theirs, not a bug
        if trainer.args.on_nonfinite_loss == "skip":
            logging.getLogger("raytrainer").warning("%s is %s; on_nonfinite_loss='skip' skips such steps.", where,
                                                    value)
            return
        raise ConfigError(f"{where} is {value}: check the labels (values the loss accepts, rows with some label "
                          "not -100), the inputs and the model's initialisation and dtype; or set "
                          "on_nonfinite_loss='skip' to train on past steps with a NaN/Inf loss.")


def _loss_failure(trainer, dataset, dataset_name: str, exc: Exception) -> str:
    columns = (list(sample_rows(dataset, 1)[0]) if is_ray_dataset(dataset) else dataset_columns(dataset)) or []
    present = set(columns) | ({"labels"} if set(LABEL_ALIASES) & set(columns) else set())
    missing = [n for n in trainer.label_names if n not in present]
    if missing and trainer.compute_loss_func is None:
        return (f"{dataset_name} has no {missing[0]!r} column, which {type(trainer.model).__name__} needs to "
                f"compute its loss (columns: {columns}). Add the label column, point label_names at it, or "
                f"pass compute_loss_func=.... The model said: {exc}")
    return (f"Computing the loss on two samples of {dataset_name} failed on the driver, before any worker "
            f"started: {type(exc).__name__}: {exc}")


def serialise(trainer, job: Optional[dict] = None):
    """The trainer (and the job) as the workers receive them: a small pickle plus the model's weights and
    large data as numpy arrays for the object store (`transfer.pack`). A failure names the attribute and
    suggests model_init."""
    from .transfer import pack

    startup = getattr(trainer, "_startup", None) if (job or {}).get("kind") == "train" else None
    if startup is not None:
        startup.driver.mark("preflight")
    try:
        packed = pack((trainer, job))
        if startup is not None:
            startup.driver.mark("pack")
        return packed
    except Exception as exc:
        dataset = (job or {}).get("dataset")
        if dataset is not None and _unpicklable_attribute({"dataset": dataset}) is not None:
            raise ConfigError(f"The dataset cannot be sent to the workers: it cannot be serialised "
                              f"({type(exc).__name__}: {exc}). Pass a datasets.Dataset or a picklable "
                              "torch Dataset.") from exc
        culprit = _unpicklable_attribute(trainer)
        hint = ("Pass model_init=<a function that builds the model> instead of the model object, so each "
                "worker builds its own." if culprit in (None, "model") else
                f"Make Trainer.{culprit} serialisable, or create it inside a hook that runs on the workers.")
        raise ConfigError(f"The trainer cannot be sent to the workers: {culprit or 'an attribute'} cannot be "
                          f"serialised ({type(exc).__name__}: {exc}). {hint}") from exc


def _unpicklable_attribute(trainer) -> Optional[str]:
    state = trainer if isinstance(trainer, dict) else trainer.__getstate__()
    for name, value in state.items():
        try:
            cloudpickle.dumps(value)
        except Exception:
            return name
    return None


def check_strategy_and_precision(trainer, use_gpu: bool, resume_url: Optional[str],
                                 resume_state: Optional[dict] = None):
    """Precision, compilation, FSDP wrapping and a resume at another world size: checked here, where we know
    whether the workers get GPUs (`use_gpu`: the cluster's GPUs, or CUDA in this process for num_workers=0)."""
    args = trainer.args
    optimizers.check_run(trainer, use_gpu)  # 8-bit GaLore and Liger kernels need GPUs; GaLore's targets exist
    if args.fp16 and not use_gpu:
        raise ConfigError("fp16=True needs GPUs, but the workers run on CPU (use_gpu is off, the cluster has no "
                          "GPUs, or num_workers=0 without CUDA). Use bf16=True on CPU, or run on GPUs.")
    if args.bf16 and use_gpu and torch.cuda.is_available() and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"bf16=True, but this machine's GPU ({torch.cuda.get_device_name()}) has no bf16 support: "
                          "use fp16=True instead.")
    if args.torch_compile:
        from torch import _dynamo  # not `import torch._dynamo`: that makes `torch` local to this function

        backends = _dynamo.list_backends(exclude_tags=())
        if args.torch_compile_backend not in backends:
            raise ConfigError(f"torch_compile_backend={args.torch_compile_backend!r} is not a torch.compile backend "
                              f"here; choose one of {', '.join(sorted(backends))}.")
    if args.strategy == "fsdp" and trainer.model is not None:
        from .strategy.blocks import check_wrap_classes

        check_wrap_classes(trainer.model, (args.fsdp_config or {}).get("transformer_layer_cls_to_wrap"))
    if resume_url is not None:
        _check_resume(trainer, resume_url, resume_state or {})


def _check_resume(trainer, resume_url: str, state: dict):
    from .checkpoint.sharded import is_sharded, strategy_mismatch
    from .data.global_batch import accumulation_to_keep
    from .state import OWN_STATE_KEY

    args = trainer.args
    if is_sharded(resume_url, args.storage_options) != (args.strategy == "fsdp"):
        raise ConfigError(strategy_mismatch(f"resume_from_checkpoint={resume_url!r}", args.strategy == "fsdp"))
    own = (state.get("stateful_callbacks") or {}).get(OWN_STATE_KEY)
    for world_size in range(max(args.min_workers, 1), max(args.max_workers, 1) + 1):  # every size it may take
        accumulation_to_keep(own, args, world_size)  # raises when the global batch cannot be kept
