"""Hyperparameter search: raytrainer's `hyperparameter_search` on Ray Tune, against transformers' own Ray backend.

    python benchmarks/tune.py              # raytrainer's Ray backend, 2 and 1 at a time: ~1 min on 2 cores
    python benchmarks/tune.py --hf         # and transformers' backend, reuse_actors False and True: + ~2 min
    python benchmarks/tune.py --optuna     # and raytrainer's Optuna backend on the same grid, in process
    python benchmarks/tune.py --hf --optuna --json /tmp/tune.json

The issue-45 sweep, on one embedded Ray of this machine's CPUs (started as raytrainer starts one): the tiny
model of the tests (`tests.models.TinyLM`, variable-length token data generated in code), a grid of 6 learning
rates, ASHA (grace period 1, reduction factor 2), 2 trials at a time, 8 steps each with an evaluation every 2
and a checkpoint every 4, 1 worker per trial. Figures per sweep:
  sweep s         the `hyperparameter_search` call (Ray already started; its start is given once)
  to 1st step s   from the call to the sweep's first training step (any trial)
  gap s           from a trial's end (on_train_end in the process that drove it) to the next trial's first step
                  (on_step_end) in the same process: the median and the largest over the sweep's trial actors
  1 at a time     the same sweep with max_concurrent_trials=1: one trial actor, one worker group start
  num_workers=0   the same sweep with each trial trained in its Tune actor (one CPU each), no worker group: what
                  transformers' backend does
  stopped         how many trials ASHA stopped before their last step (with 2 at a time, which trials it stops
                  depends on which reported first: see docs/tune.md)
raytrainer's trials each run on a worker group (Ray Train, one worker); its trial actors are reused, and with
them their warm groups. `--optuna`: raytrainer's Optuna backend on the same grid (GridSampler, successive
halving), one trial after another in this process, on this process's pool. transformers' trials run the whole
Trainer in the trial's process; its scheduler is given `metric="objective"` by hand (it refuses one without).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import common

sys.path.insert(0, common.REPO_ROOT)

GRID = [1e-1, 3e-2, 1e-2, 3e-3, 1e-3, 1e-4]
STEPS, EVAL_STEPS, SAVE_STEPS, CONCURRENT = 8, 2, 4, 2


class StampsMixin:
    """Writes one JSON line per run's first step and end, with the process id and the run's folder."""

    def __init__(self, path: str):
        self.path = path
        self.first_done = set()

    def _write(self, kind: str, args, state):
        with open(self.path, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "run": args.output_dir, "kind": kind, "t": time.time(),
                                "step": state.global_step}) + "\n")

    def on_step_end(self, args, state, control, **kwargs):
        if args.output_dir not in self.first_done:
            self.first_done.add(args.output_dir)
            self._write("first_step", args, state)

    def on_train_end(self, args, state, control, **kwargs):
        self._write("end", args, state)


def model_init():
    from tests.models import make_model

    return make_model()


def datasets():
    from tests.models import TokenData

    return TokenData(64), TokenData(16, seed=1)


def gaps(path: str, started: float) -> dict:
    """Per trial process, from each run's end to the next run's first step; and from the call (`started`, wall
    clock) to the sweep's first step and to its last run's end."""
    with open(path) as f:
        stamps = [json.loads(line) for line in f if line.strip()]
    firsts = [s["t"] for s in stamps if s["kind"] == "first_step"]
    timeline = {"to_first_step_s": min(firsts) - started if firsts else None,
                "to_last_end_s": max(s["t"] for s in stamps) - started if stamps else None}
    found, stopped = [], 0
    for pid in {s["pid"] for s in stamps}:
        events = sorted((s for s in stamps if s["pid"] == pid), key=lambda s: s["t"])
        for before, after in zip(events, events[1:]):
            if before["kind"] == "end" and after["kind"] == "first_step":
                found.append(after["t"] - before["t"])
    stopped = sum(1 for s in stamps if s["kind"] == "end" and s["step"] < STEPS)
    return {"gaps_s": found, "median_gap_s": statistics.median(found) if found else None,
            "max_gap_s": max(found) if found else None, "stopped": stopped,
            "trial_processes": len({s["pid"] for s in stamps}), **timeline}


def ours(work: str, concurrent: int = CONCURRENT, workers: int = 1) -> dict:
    """raytrainer's Ray backend: each trial on a `workers`-worker group (0: the trial trains in its Tune actor,
    on one CPU, as transformers' trials do)."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from raytrainer import Trainer, TrainerCallback, TrainingArguments
    from raytrainer.data.collator import DefaultCollator

    class Stamps(StampsMixin, TrainerCallback):
        observes_only = True  # never changes control: no round trip per step

    stamps = os.path.join(work, f"ours-{concurrent}-{workers}.jsonl")
    train, evaluation = datasets()
    args = TrainingArguments(output_dir=os.path.join(work, f"ours-{concurrent}-{workers}"), num_workers=workers,
                             per_device_train_batch_size=4, max_steps=STEPS, eval_strategy="steps",
                             eval_steps=EVAL_STEPS, save_steps=SAVE_STEPS, logging_steps=EVAL_STEPS,
                             optim="adamw_torch", disable_tqdm=True, report_to=[])
    trainer = Trainer(model_init=model_init, args=args, data_collator=DefaultCollator(), train_dataset=train,
                      eval_dataset=evaluation, callbacks=[Stamps(stamps)])
    t0, started = time.perf_counter(), time.time()
    best = trainer.hyperparameter_search(
        hp_space=lambda _: {"learning_rate": tune.grid_search(GRID)}, n_trials=1, max_concurrent_trials=concurrent,
        scheduler=ASHAScheduler(max_t=100, grace_period=1, reduction_factor=2), verbose=0)
    return {"sweep_s": time.perf_counter() - t0, "best": [best.hyperparameters, best.objective],
               **gaps(stamps, started)}


def ours_optuna(work: str) -> dict:
    """backend="optuna": the same grid (GridSampler) with Optuna's successive-halving pruner, in this process;
    its worker group is released after it (the next sweeps need its CPU)."""
    import optuna

    from raytrainer import Trainer, TrainerCallback, TrainingArguments
    from raytrainer.coordinator import holders
    from raytrainer.data.collator import DefaultCollator

    class Stamps(StampsMixin, TrainerCallback):
        observes_only = True

    stamps = os.path.join(work, "optuna.jsonl")
    train, evaluation = datasets()
    args = TrainingArguments(output_dir=os.path.join(work, "optuna"), num_workers=1, per_device_train_batch_size=4,
                             max_steps=STEPS, eval_strategy="steps", eval_steps=EVAL_STEPS, save_steps=SAVE_STEPS,
                             logging_steps=EVAL_STEPS, optim="adamw_torch", disable_tqdm=True, report_to=[])
    trainer = Trainer(model_init=model_init, args=args, data_collator=DefaultCollator(), train_dataset=train,
                      eval_dataset=evaluation, callbacks=[Stamps(stamps)])
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    t0, started = time.perf_counter(), time.time()
    best = trainer.hyperparameter_search(
        hp_space=lambda trial: {"learning_rate": trial.suggest_categorical("learning_rate", GRID)},
        n_trials=len(GRID), backend="optuna", sampler=optuna.samplers.GridSampler({"learning_rate": GRID}),
        pruner=optuna.pruners.SuccessiveHalvingPruner())
    figures = {"sweep_s": time.perf_counter() - t0, "best": [best.hyperparameters, best.objective],
               **gaps(stamps, started)}
    holders.release_all(wait=True)
    return figures


def transformers_backend(work: str, reuse_actors: bool) -> dict:
    import transformers
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from raytrainer.data.collator import DefaultCollator

    class Stamps(StampsMixin, transformers.TrainerCallback):
        pass

    name = f"hf-reuse-{reuse_actors}"
    stamps = os.path.join(work, f"{name}.jsonl")
    train, evaluation = datasets()
    args = transformers.TrainingArguments(
        output_dir=os.path.join(work, name), per_device_train_batch_size=4, max_steps=STEPS, eval_strategy="steps",
        eval_steps=EVAL_STEPS, save_steps=SAVE_STEPS, logging_steps=EVAL_STEPS, optim="adamw_torch",
        disable_tqdm=True, report_to=[], use_cpu=True, remove_unused_columns=False)
    trainer = transformers.Trainer(model_init=model_init, args=args, data_collator=DefaultCollator(),
                                   train_dataset=train, eval_dataset=evaluation, callbacks=[Stamps(stamps)])
    t0, started = time.perf_counter(), time.time()
    best = trainer.hyperparameter_search(
        hp_space=lambda _: {"learning_rate": tune.grid_search(GRID)}, n_trials=1, backend="ray",
        max_concurrent_trials=CONCURRENT, reuse_actors=reuse_actors, storage_path=os.path.join(work, f"{name}-tune"),
        scheduler=ASHAScheduler(metric="objective", mode="min", max_t=100, grace_period=1, reduction_factor=2),
        verbose=0)
    return {"sweep_s": time.perf_counter() - t0, "best": [best.hyperparameters, best.objective],
               **gaps(stamps, started)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hf", action="store_true", help="also transformers' Ray backend (reuse_actors off and on)")
    parser.add_argument("--optuna", action="store_true", help="also backend='optuna' (needs optuna)")
    parser.add_argument("--json", default=None)
    cli = parser.parse_args()
    common.quiet_ray_logs()
    os.environ["RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"] = "0"  # one node: nothing to drain (as raytrainer's own Ray)
    # Started as raytrainer starts an embedded Ray (cluster.connect): with a dashboard whose state API Ray Train's
    # placement-group cleaner is pointed at. Tune kills the trial actors at the end of a sweep, and with them the
    # worker groups' controllers; their placement groups are removed by that cleaner. Without its state API
    # (common.start_ray) the cleaner dies, the groups' CPUs stay reserved, and the next sweep waits forever.
    from raytrainer.coordinator import cluster

    t0 = time.perf_counter()
    cluster.connect("local")
    ray_start_s = time.perf_counter() - t0
    results = {"machine": common.machine_info(), "ray_start_s": ray_start_s, "load_before": os.getloadavg()[0]}
    runs = [("raytrainer, ray", ours), ("raytrainer, ray, 1 at a time", lambda w: ours(w, 1)),
            ("raytrainer, ray, num_workers=0 (in the trial actor)", lambda w: ours(w, workers=0))]
    if cli.optuna:
        runs.append(("raytrainer, optuna (1 at a time)", ours_optuna))
    if cli.hf:
        runs += [("transformers, reuse_actors=False", lambda w: transformers_backend(w, False)),
                 ("transformers, reuse_actors=True", lambda w: transformers_backend(w, True))]
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for name, run in runs:
            figures = results[name] = run(work)
            rows.append([name, figures["sweep_s"], figures["to_first_step_s"], figures["median_gap_s"],
                         figures["max_gap_s"],
                         figures["stopped"], figures["trial_processes"]])
            print(f"{name}: {json.dumps(figures, default=str)}", flush=True)
    results["load_after"] = os.getloadavg()[0]
    common.print_table(f"6-trial sweep, ASHA, {CONCURRENT} at a time ({os.cpu_count()} CPUs; Ray started in "
                       f"{ray_start_s:.1f} s; load {results['load_before']:.1f} -> {results['load_after']:.1f})",
                       ["backend", "sweep s", "to 1st step s", "gap s (median)", "gap s (max)", "stopped",
                        "trial processes"], rows)
    if cli.json:
        with open(cli.json, "w") as f:
            json.dump(results, f, indent=1, default=str)
    common.stop_ray()


if __name__ == "__main__":
    main()
