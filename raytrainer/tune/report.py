"""The trial's one link to Ray Tune: a driver-side callback that reports each evaluation, and takes Tune's stop.

It runs where the trial's `train()` pumps its events (the Tune trial's thread, on the driver side of the run),
after the central event stream has reduced the evaluation across ranks: the objective Tune sees is the run's,
not one rank's. A scheduler's stop comes back through the same call. Tune's function trainables report
synchronously (`synchronous_result_reporting=True`): `tune.report` returns when Tune let the trial go on, and
raises `SystemExit` in this thread when Tune stopped the trial (ASHA, a `stop` condition, the end of the
sweep). The callback turns that into `control.should_training_stop` at this evaluation's step; the workers are
waiting for the driver's answer to this event (the callback may change control: it is not `observes_only`),
so every rank stops at the same step (principle 1), the run ends as a stopped run ends (its checkpoints
committed), and its workers go back to the trial process's pool.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Callable, Dict, Optional

from ..callbacks.base import TrainerCallback

OBJECTIVE = "objective"  # the metric's name in Tune, as transformers names it


def default_compute_objective(metrics: Dict[str, float]) -> float:
    """transformers' `default_compute_objective`, the same code (tests/tune/test_report.py compares the two): the
    evaluation loss if no other metric is there, else the sum of the metrics, the epoch and speed metrics left
    out. Defined here, not imported: it runs in every trial's actor, and importing transformers' trainer_utils
    there cost 4.6 s of each actor's start on a 2-core machine (benchmarks/tune.py)."""
    metrics = copy.deepcopy(metrics)
    loss = metrics.pop("eval_loss", None)
    metrics.pop("epoch", None)
    for name in [m for m in metrics if m.endswith("_runtime") or m.endswith("_per_second")]:
        metrics.pop(name, None)
    return loss if len(metrics) == 0 else sum(metrics.values())


def objective_of(compute_objective: Callable[[Dict[str, float]], Any], metrics: Optional[Dict[str, Any]]):
    """An evaluation's metrics as transformers' evaluate() returns them (without the log record's "step", which
    the loop's log adds: default_compute_objective would sum it into the objective), and their objective."""
    metrics = {k: v for k, v in (metrics or {}).items() if k != "step"}
    return metrics, compute_objective(dict(metrics))


def tune_metrics(metrics: Dict[str, Any], objective: float, step: int, epoch: Optional[float]) -> Dict[str, Any]:
    """What one evaluation reports: its numeric metrics, the objective, the run's global step and epoch."""
    out = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    out.update({OBJECTIVE: float(objective), "step": int(step)})
    if epoch is not None:
        out["epoch"] = float(epoch)
    return out


class TuneReport(TrainerCallback):
    """on_evaluate: `tune.report(metrics + objective)`; Tune's stop becomes `should_training_stop` here.

    `reported` counts the evaluations Tune took (0 after a run without evaluation: the trial then evaluates
    once at its end, as transformers' Ray backend does); `stopped` is set once Tune stopped the trial."""

    observes_only = False  # its answer (stop or go on) is awaited by every rank at the evaluation's step

    def __init__(self, compute_objective: Callable[[Dict[str, float]], float],
                 report: Optional[Callable[[Dict[str, Any]], None]] = None):
        self.compute_objective = compute_objective
        self._report = report  # tune.report, or a test's stand-in
        self.reported = 0
        self.stopped = False
        self.last: Optional[Dict[str, Any]] = None

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if self.stopped:  # a stopped trial reports nothing more (Tune has closed its session)
            return
        metrics, objective = objective_of(self.compute_objective, metrics)
        if objective is None or (isinstance(objective, float) and math.isnan(objective)):
            raise ValueError(f"compute_objective returned {objective!r} for the metrics {sorted(metrics)}: pass a "
                             "compute_objective that returns a number from the evaluation's metrics.")
        result = tune_metrics(metrics, objective, state.global_step, state.epoch)
        try:
            self.report(result)
        except SystemExit:
            self.stopped = True
            control.should_training_stop = True
            return
        self.reported += 1
        self.last = result

    def report(self, result: Dict[str, Any]):
        if self._report is not None:
            return self._report(result)
        from ray import tune

        return tune.report(result)
