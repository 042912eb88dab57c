"""`module:function` references of a `raytrainer train` config, resolved on the driver before any actor starts.

A reference is `"package.module:function"` (a dotted attribute path after the colon also works:
`module:Class.method`) or, in the YAML, a mapping `{ref: "module:function", kwargs: {...}}`. The current
directory goes first on the import path, as with `python -m`, so a config run from a project's root finds that
project's modules (Ray workers get the same directory: the driver's working directory, or the job's
`--working-dir`).

Built objects (`model`, `train_dataset`, `eval_dataset`) are the result of calling the reference with its
kwargs; everything else is handed to the Trainer as it is (with kwargs bound by `functools.partial`).
Any reference that does not import, does not exist, is not callable or does not take its kwargs is a
`ConfigError` naming the config key, the reference and the reason.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from ..errors import ConfigError

BUILT = ("model", "train_dataset", "eval_dataset")  # called once on the driver; the result goes to the Trainer


def _ref(help_text: str):
    return field(default=None, metadata={"help": help_text + " (module:function)"})


@dataclass
class TrainReferences:
    """The non-argument inputs of a Trainer, as references. Read by `ArgumentParser` next to TrainingArguments."""

    _argument_group_name = "references (module:function; in YAML also {ref: ..., kwargs: {...}})"

    model: Optional[str] = _ref("Function returning the torch.nn.Module to train; called with its kwargs.")
    model_init: Optional[str] = _ref("Function returning a fresh model, called on every worker (instead of model).")
    train_dataset: Optional[str] = _ref("Function returning the training dataset; called with its kwargs.")
    eval_dataset: Optional[str] = _ref("Function returning the evaluation dataset; called with its kwargs.")
    data_collator: Optional[str] = _ref("Collator: called with a list of samples, returns a batch.")
    compute_metrics: Optional[str] = _ref("Function of an EvalPrediction returning a dict of metrics.")
    preprocess_logits_for_metrics: Optional[str] = _ref("Function (logits, labels) -> what compute_metrics sees.")
    trainer_class: Optional[str] = _ref("A raytrainer.Trainer subclass to use (e.g. one overriding compute_loss).")


def _split(key: str, value: Any) -> tuple[str, dict]:
    """The reference string and its kwargs, from `"mod:fn"` or `{ref: "mod:fn", kwargs: {...}}`."""
    if isinstance(value, dict):
        unknown = sorted(set(value) - {"ref", "kwargs"})
        if unknown or "ref" not in value:
            raise ConfigError(f"{key}: a mapping reference takes the keys 'ref' (required) and 'kwargs', got "
                              f"{sorted(value)}. Example: {key}: {{ref: 'mymodule:build', kwargs: {{size: 8}}}}")
        kwargs = value.get("kwargs") or {}
        if not isinstance(kwargs, dict):
            raise ConfigError(f"{key}: kwargs must be a mapping of argument names to values, got {kwargs!r}.")
        value = value["ref"]
    else:
        kwargs = {}
    if not isinstance(value, str) or value.count(":") != 1 or not all(value.split(":")):
        raise ConfigError(f"{key}={value!r} is not a reference: write 'package.module:function'.")
    return value, kwargs


def import_reference(key: str, ref: str) -> Any:
    """The object `ref` names; a ConfigError naming `key`, `ref` and why when it cannot be had."""
    module_name, attr_path = ref.split(":")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)  # `raytrainer` is a console script: unlike `python -m`, it does not add it
    try:
        obj = importlib.import_module(module_name)
    except Exception as exc:
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name and module_name.startswith(exc.name):
            hint = (f" Run from the folder that holds {module_name.split('.')[0]!r} (the current directory, "
                    f"{cwd}, is on the import path) or add its folder to PYTHONPATH.")
        raise ConfigError(f"{key}: cannot import module {module_name!r} of {ref!r}: "
                          f"{type(exc).__name__}: {exc}.{hint}") from None
    for part in attr_path.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"{key}: {ref!r}: {getattr(obj, '__name__', module_name)!r} has no attribute "
                              f"{part!r}.") from None
    if not callable(obj):
        raise ConfigError(f"{key}: {ref!r} is a {type(obj).__name__}, not a function or class.")
    return obj


def _check_kwargs(key: str, ref: str, target: Any, kwargs: dict, partial: bool) -> None:
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):
        return  # builtins without a signature: the call itself will tell
    try:
        (signature.bind_partial if partial else signature.bind)(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{key}: kwargs {kwargs} do not fit {ref}{signature}: {exc}.") from None


def resolve(refs: TrainReferences) -> tuple[type, dict]:
    """(Trainer class, Trainer keyword arguments) from the references that are set."""
    from ..trainer import Trainer

    trainer_class, kwargs, build = Trainer, {}, []
    # Import and check every reference first: a typo in the last one fails before the model is built.
    for f in fields(refs):
        value = getattr(refs, f.name)
        if value is None:
            continue
        ref, ref_kwargs = _split(f.name, value)
        target = import_reference(f.name, ref)
        if f.name == "trainer_class":
            if ref_kwargs or not (isinstance(target, type) and issubclass(target, Trainer)):
                raise ConfigError(f"trainer_class: {ref!r} must be a subclass of raytrainer.Trainer, without "
                                  "kwargs.")
            trainer_class = target
            continue
        _check_kwargs(f.name, ref, target, ref_kwargs, partial=f.name not in BUILT)
        if f.name in BUILT:
            build.append((f.name, target, ref_kwargs))
        else:
            kwargs[f.name] = functools.partial(target, **ref_kwargs) if ref_kwargs else target
    if refs.model is None and refs.model_init is None:
        raise ConfigError("The config names no model: add `model: package.module:function` (a function that "
                          "returns the model) or `model_init: ...`.")
    for name, target, ref_kwargs in build:
        kwargs[name] = target(**ref_kwargs)
    return trainer_class, kwargs
