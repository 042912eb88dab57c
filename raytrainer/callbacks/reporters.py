"""`report_to`: experiment trackers chosen by name, as in Hugging Face.

    report_to="none" | "all" | "tensorboard" | "mlflow" | ["tensorboard", "mlflow"]

A reporter is an ordinary callback that runs on the driver: it sees one event stream for the whole run
(metrics already reduced across ranks), so it writes one record per step whatever the world size.

Adding a reporter: pass an instance in `Trainer(callbacks=[...])`, or give it a name with
`register_reporter("name", cls)` (cls takes no arguments) before building `TrainingArguments(report_to="name")`.

The names are checked at `TrainingArguments` construction, by `raytrainer/arguments/report_to.py` (the registry),
without importing the tracker; this module builds the callbacks they name.
"""

from __future__ import annotations

import importlib
from typing import Optional

from ..arguments import report_to


def reporter_class(name: str) -> type:
    if name in report_to.REGISTERED:
        return report_to.REGISTERED[name]
    spec = report_to.BUILTIN[name]
    return getattr(importlib.import_module(spec.module), spec.cls)


def reporter_callbacks(args) -> list:
    """One callback instance per name in `args.report_to` (already normalised by TrainingArguments)."""
    names: Optional[list] = getattr(args, "report_to", None)
    return [reporter_class(name)() for name in report_to.normalise_report_to(names)]


def rank_metrics(rank_stats) -> dict:
    """Per-rank figures of a log record (`on_log(rank_stats=...)`) as flat metrics: `rank1/data_wait_s`, ...
    so a straggler shows as one curve apart from the others."""
    out = {}
    for figures in rank_stats or []:
        rank = figures.get("rank")
        out.update({f"rank{rank}/{k}": v for k, v in figures.items()
                    if k != "rank" and isinstance(v, (int, float)) and not isinstance(v, bool)})
    return out


AXIS_KEYS = ("step",)  # the x axis, not a curve


def rewrite_logs(logs: dict) -> dict:
    """HF's tag names (its TensorBoard and W&B reporters'): eval_x -> eval/x, test_x -> test/x, everything else
    train/x (ours: rankN/x stays)."""
    out = {}
    for key, value in logs.items():
        if key in AXIS_KEYS:
            continue
        if key.startswith("rank") and "/" in key:
            out[key] = value
        elif key.startswith("eval_"):
            out["eval/" + key[len("eval_"):]] = value
        elif key.startswith("test_"):
            out["test/" + key[len("test_"):]] = value
        else:
            out["train/" + key] = value
    return out
