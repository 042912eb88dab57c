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

Under Population Based Training (`TuneReportAtCommit`), each report also carries a Tune checkpoint: a folder
holding one small JSON that names the run's checkpoint of the evaluation's step (`POINTER`), sent once that
checkpoint is committed (PBT needs every evaluation step to be a save step: options.check_evaluates). The weights
stay in the run's folder, committed by raytrainer; Tune keeps the pointer and hands it to the trial that continues
it (trial.py).
"""

from __future__ import annotations

import copy
import json
import math
import os
import tempfile
from typing import Any, Callable, Dict, Optional

from ..callbacks.base import TrainerCallback
from ..checkpoint.listing import step_of_name
from ..storage import basename

OBJECTIVE = "objective"  # the metric's name in Tune, as transformers names it
POINTER = "raytrainer_checkpoint.json"  # in a Tune checkpoint: the run's checkpoint {"url", "step"}


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
    """An evaluation's metrics as transformers' evaluate() returns them, and their objective."""
    metrics = dict(metrics or {})
    return metrics, compute_objective(dict(metrics))


def tune_metrics(metrics: Dict[str, Any], objective: float, step: int, epoch: Optional[float]) -> Dict[str, Any]:
    """What one evaluation reports: its numeric metrics, the objective, the run's global step and epoch."""
    out = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    out.update({OBJECTIVE: float(objective), "step": int(step)})
    if epoch is not None:
        out["epoch"] = float(epoch)
    return out


class WholeEvaluation:
    """The metrics of every eval dataset of one evaluation, once its last on_evaluate came: a dict of eval
    datasets is one on_evaluate each (as transformers' evaluate), and transformers reports their merged metrics
    to the search. `eval_datasets_left` (raytrainer's events) says how many are still to come."""

    def __init__(self):
        self._so_far: Dict[str, Any] = {}

    def add(self, metrics: Optional[Dict[str, Any]], kwargs: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        """The whole evaluation's metrics after its last dataset's on_evaluate; None before."""
        self._so_far.update(metrics or {})
        if kwargs.get("eval_datasets_left", 0):
            return None
        whole, self._so_far = self._so_far, {}
        return whole


class TuneReport(TrainerCallback):
    """on_evaluate: `tune.report(metrics + objective)`; Tune's stop becomes `should_training_stop` here.

    `reported` counts the evaluations Tune took (0 after a run without evaluation: the trial then evaluates
    once at its end, as transformers' Ray backend does); `stopped` is set once Tune stopped the trial."""

    observes_only = False  # its answer (stop or go on) is awaited by every rank at the evaluation's step
    with_checkpoint = False  # its reports name no checkpoint (TuneReportAtCommit's do)

    def __init__(self, compute_objective: Callable[[Dict[str, float]], float],
                 report: Optional[Callable[..., None]] = None):
        self.compute_objective = compute_objective
        self._report = report  # tune.report, or a test's stand-in
        self.reported = 0
        self.stopped = False
        self.last: Optional[Dict[str, Any]] = None
        self.evaluation = WholeEvaluation()

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        whole = self.evaluation.add(metrics, kwargs)
        if whole is not None and not self.stopped:  # a stopped trial reports nothing more (its session closed)
            self.send(self.result_of(state, whole), control)

    def result_of(self, state, metrics) -> Dict[str, Any]:
        metrics, objective = objective_of(self.compute_objective, metrics)
        if objective is None or (isinstance(objective, float) and math.isnan(objective)):
            raise ValueError(f"compute_objective returned {objective!r} for the metrics {sorted(metrics)}: pass a "
                             "compute_objective that returns a number from the evaluation's metrics.")
        return tune_metrics(metrics, objective, state.global_step, state.epoch)

    def send(self, result: Dict[str, Any], control, pointer: Optional[Dict[str, Any]] = None):
        try:
            self.report(result, pointer)
        except SystemExit:
            self.stopped = True
            control.should_training_stop = True
            return
        self.reported += 1
        self.last = result

    def report(self, result: Dict[str, Any], pointer: Optional[Dict[str, Any]] = None):
        if self._report is not None:
            return self._report(result) if pointer is None else self._report(result, pointer)
        from ray import tune

        if pointer is None:
            return tune.report(result)
        with tempfile.TemporaryDirectory(prefix="raytrainer-tune-") as folder:  # Tune copies it into its storage
            with open(os.path.join(folder, POINTER), "w") as f:
                json.dump(pointer, f)
            return tune.report(result, checkpoint=tune.Checkpoint.from_directory(folder))


class TuneReportAtCommit(TuneReport):
    """Under Population Based Training: an evaluation's result waits for its step's checkpoint (every evaluation
    step saves: options.check_evaluates) and goes to Tune once that checkpoint is committed (on_save), with a
    pointer to it. PBT hands a reported checkpoint at once to the trial that exploits this one, and pauses
    trials by ending their actors: reported at the evaluation, before the save, the checkpoint died with a paused
    trial's actor in 1 of 4 runs of the PBT test, and nobody could continue it.

    A stop that Tune gives at on_save reaches the workers at their next step's end: `on_step_end`, implemented
    here, makes every step's end a point where every rank takes the driver's decision (a round trip per step,
    under PBT only)."""

    with_checkpoint = True

    def __init__(self, compute_objective: Callable[[Dict[str, float]], float],
                 report: Optional[Callable[..., None]] = None):
        super().__init__(compute_objective, report)
        # The evaluations' results by step, each until its step's checkpoint is committed. More than one waits
        # when a commit is reported after the next evaluation (num_workers=0: the commit's event comes from the
        # writer thread while the loop trains on; a tiny model evaluates step s + 1 first).
        self.pending: Dict[int, Dict[str, Any]] = {}

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        whole = self.evaluation.add(metrics, kwargs)
        if whole is not None and not self.stopped:
            self.pending[state.global_step] = self.result_of(state, whole)

    def on_save(self, args, state, control, checkpoint=None, **kwargs):
        # The save event's step is its checkpoint's (state.global_step may be later: num_workers=0).
        step = _step_of(checkpoint, state.global_step)
        result = self.pending.pop(step, None)
        for earlier in [s for s in self.pending if s < step]:  # evaluations whose step saved nothing (none
            del self.pending[earlier]  # should: every evaluation step saves, options.check_evaluates)
        if self.stopped or result is None:
            return  # a save without an evaluation at its step: nothing for Tune
        self.send(result, control, {"url": checkpoint, "step": step})  # the save event's URL

    def on_step_end(self, args, state, control, **kwargs):
        """The run's last step is evaluated and saved: its result goes to Tune with its checkpoint, as every result
        under PBT (a result without one, after training, was one more for PBT to act on: with Ray's example
        time_attr="training_iteration", each result a perturbation, a trial continued at its last step evaluated
        again, was paused and continued again, without end). The method also makes every step's end a decision
        point (see the class)."""
        if state.max_steps and state.global_step >= state.max_steps:
            control.should_evaluate = control.should_save = True


def _step_of(checkpoint: Optional[str], default: int) -> int:
    """The step of a checkpoint URL (`.../checkpoint-N`), else `default`."""
    step = step_of_name(basename(checkpoint.rstrip("/"))) if checkpoint else None
    return default if step is None else step


def pointed_checkpoint(checkpoint) -> Optional[Dict[str, Any]]:
    """The run's checkpoint that a Tune checkpoint of ours names ({"url", "step"}); None for any other."""
    if checkpoint is None:
        return None
    with checkpoint.as_directory() as folder:
        path = os.path.join(folder, POINTER)
        if not os.path.exists(path):
            return None
        with open(path) as f:
            return json.load(f)
