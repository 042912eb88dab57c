"""`report_to`: experiment trackers chosen by name, as in Hugging Face.

    report_to="none" | "all" | "tensorboard" | "mlflow" | ["tensorboard", "mlflow"]

A reporter is an ordinary callback that runs on the driver: it sees one event stream for the whole run
(metrics already reduced across ranks), so it writes one record per step whatever the world size.

Adding a reporter: pass an instance in `Trainer(callbacks=[...])`, or give it a name with
`register_reporter("name", cls)` (cls takes no arguments) before building `TrainingArguments(report_to="name")`.

Names are checked at `TrainingArguments` construction, without importing the tracker (its import can take
seconds): an unknown name, or a tracker whose package is missing, is a `ConfigError` naming the pip extra.
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from typing import Optional, Union

from ..errors import ConfigError


@dataclass(frozen=True)
class _Builtin:
    module: str
    cls: str
    package: str  # what must be importable
    extra: str    # pip install "raytrainer[extra]"


_BUILTIN = {
    "tensorboard": _Builtin("raytrainer.callbacks.tensorboard", "TensorBoardCallback", "tensorboard", "tensorboard"),
    "mlflow": _Builtin("raytrainer.callbacks.mlflow", "MLflowCallback", "mlflow", "mlflow"),
}
_REGISTERED: dict = {}


def register_reporter(name: str, cls: type) -> None:
    """Make `report_to=name` add `cls()` to every Trainer built afterwards (a user's name wins over ours)."""
    if not isinstance(name, str) or not name or name in ("none", "all"):
        raise ConfigError(f"register_reporter: {name!r} cannot name a reporter ('none' and 'all' are reserved).")
    if not callable(cls):
        raise ConfigError(f"register_reporter({name!r}, ...) needs a callback class, got {cls!r}.")
    _REGISTERED[name] = cls


def reporter_names() -> list:
    return sorted(set(_BUILTIN) | set(_REGISTERED))


def missing_package(package: str, extra: str, what: str) -> ConfigError:
    return ConfigError(f"{what} needs the {package!r} package, which is not installed: "
                       f'pip install "raytrainer[{extra}]".')


def _installed(name: str) -> bool:
    if name in _REGISTERED:
        return True
    return importlib.util.find_spec(_BUILTIN[name].package) is not None


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
            raise missing_package(_BUILTIN[name].package, _BUILTIN[name].extra, f"report_to={name!r}")
    return list(dict.fromkeys(names))  # drop repeats, keep order


def reporter_class(name: str) -> type:
    if name in _REGISTERED:
        return _REGISTERED[name]
    spec = _BUILTIN[name]
    return getattr(importlib.import_module(spec.module), spec.cls)


def reporter_callbacks(args) -> list:
    """One callback instance per name in `args.report_to` (already normalised by TrainingArguments)."""
    names: Optional[list] = getattr(args, "report_to", None)
    return [reporter_class(name)() for name in normalise_report_to(names)]


def rank_metrics(rank_stats) -> dict:
    """Per-rank figures of a log record (`on_log(rank_stats=...)`) as flat metrics: `rank1/data_wait_s`, ...
    so a straggler shows as one curve apart from the others."""
    out = {}
    for figures in rank_stats or []:
        rank = figures.get("rank")
        out.update({f"rank{rank}/{k}": v for k, v in figures.items()
                    if k != "rank" and isinstance(v, (int, float)) and not isinstance(v, bool)})
    return out
