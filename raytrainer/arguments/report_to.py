"""`report_to`'s names: the reporters built in and registered, checked when `TrainingArguments` is built.

    report_to="none" | "all" | "tensorboard" | "mlflow" | "wandb" | "trackio" | ["tensorboard", "mlflow"]

Names are checked without importing the tracker (its import can take seconds): an unknown name, or a tracker
whose package is missing, is a `ConfigError` naming the pip extra. The callbacks themselves are built by
`callbacks/reporters.py`, in the layer above.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Union

from ..errors import ConfigError, missing_package


@dataclass(frozen=True)
class _Builtin:
    module: str
    cls: str
    package: str  # what must be importable
    extra: str    # pip install "raytrainer[extra]"


BUILTIN = {
    "tensorboard": _Builtin("raytrainer.callbacks.tensorboard", "TensorBoardCallback", "tensorboard", "tensorboard"),
    "mlflow": _Builtin("raytrainer.callbacks.mlflow", "MLflowCallback", "mlflow", "mlflow"),
    "wandb": _Builtin("raytrainer.callbacks.wandb", "WandbCallback", "wandb", "wandb"),
    "trackio": _Builtin("raytrainer.callbacks.trackio", "TrackioCallback", "trackio", "trackio"),
}
REGISTERED: dict = {}


def register_reporter(name: str, cls: type) -> None:
    """Make `report_to=name` add `cls()` to every Trainer built afterwards (a user's name wins over ours)."""
    if not isinstance(name, str) or not name or name in ("none", "all"):
        raise ConfigError(f"register_reporter: {name!r} cannot name a reporter ('none' and 'all' are reserved).")
    if not callable(cls):
        raise ConfigError(f"register_reporter({name!r}, ...) needs a callback class, got {cls!r}.")
    REGISTERED[name] = cls


def reporter_names() -> list:
    return sorted(set(BUILTIN) | set(REGISTERED))


def _installed(name: str) -> bool:
    if name in REGISTERED:
        return True
    return importlib.util.find_spec(BUILTIN[name].package) is not None


def available_reporters() -> list:
    """The reporters `report_to="all"` means: ours whose package is installed, and every registered one."""
    return [name for name in reporter_names() if _installed(name)]


def normalise_report_to(value: Union[None, str, list, tuple]) -> list:
    """HF's rule: "all" -> the installed reporters, "none"/None -> [], a name -> [name]. Checks each name."""
    if value is None or value == "none" or value == ["none"]:
        return []
    if value == "all" or value == ["all"]:
        return available_reporters()
    names = [value] if isinstance(value, str) else list(value)
    for name in names:
        if name in ("none", "all"):
            raise ConfigError(f"report_to={value!r}: 'none' and 'all' cannot be combined with other names.")
        if not isinstance(name, str) or name not in reporter_names():
            choices = ", ".join(["none", "all", *reporter_names()])
            raise ConfigError(f"report_to={value!r}: {name!r} is not a reporter; choose from {choices}. To add "
                              "your own, call raytrainer.register_reporter(name, cls) first, or pass the callback "
                              "in Trainer(callbacks=[...]).")
        if not _installed(name):
            raise missing_package(BUILTIN[name].package, BUILTIN[name].extra, f"report_to={name!r}")
    return list(dict.fromkeys(names))  # drop repeats, keep order
