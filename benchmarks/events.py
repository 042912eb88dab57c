"""Loop overhead of event streaming and central control, on 2 workers: the same run with logging off, and
with `logging_steps=1` plus driver callbacks of increasing cost, as ratios of the steady-state step time.

    python benchmarks/events.py                 # 300 steps x 2 rounds, ~3 min on 2 cores
    python benchmarks/events.py --quick         # 120 steps x 1 round
    python benchmarks/events.py --variants off,step_end,step_end_next

Variants (all 2 workers, DDP over gloo, the MLP of overhead.py, no checkpoints):
  off       logging_strategy="no": events still stream (steps), nobody waits for the driver
  observe   logging_steps=1 and an observing callback (observes_only=True): a log all-reduce per step
  on_log    logging_steps=1 and a callback that may stop training in on_log: a driver round trip per log
  step_end  logging_steps=1 and a callback that may stop training in on_step_end: a round trip per step
  on_eval   logging_steps=1 and an early stopper listening to on_evaluate only (no evaluation here): no
            round trip, the cost of a typical EarlyStoppingCallback between evaluations
  on_log_next, step_end_next   on_log and step_end with callback_decisions="next_step": the answer is
            applied one step later, so no step waits for it

Target: on_log / off <= 1.03 (the issue's "a driver callback that can stop training attached").
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import common
from overhead import Config, _result, build_dataset, build_model

import raytrainer


class Observe(raytrainer.TrainerCallback):
    observes_only = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.last = logs


class MayStopOnLog(raytrainer.TrainerCallback):
    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs.get("loss", 1.0) < 0:  # never: the cost is the round trip, not the decision
            control.should_training_stop = True


class MayStopOnStep(raytrainer.TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step < 0:
            return {"should_training_stop": True}


class MayStopOnEvaluate(raytrainer.TrainerCallback):
    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        if metrics and metrics.get("eval_loss", 1.0) < 0:
            control.should_training_stop = True


VARIANTS = {
    "off": (dict(logging_strategy="no"), []),
    "observe": (dict(logging_steps=1), [Observe]),
    "on_log": (dict(logging_steps=1), [MayStopOnLog]),
    "step_end": (dict(logging_steps=1), [MayStopOnStep]),
    "on_eval": (dict(logging_steps=1), [MayStopOnEvaluate]),
    "on_log_next": (dict(logging_steps=1, callback_decisions="next_step"), [MayStopOnLog]),
    "step_end_next": (dict(logging_steps=1, callback_decisions="next_step"), [MayStopOnStep]),
}


def run(cfg: Config, workdir: str, name: str) -> dict:
    extra, callbacks = VARIANTS[name]
    timed = common.make_timed_trainer_class()
    stamp_dir = tempfile.mkdtemp(prefix=f"ev-{name}-", dir=workdir)
    args = raytrainer.TrainingArguments(
        output_dir=os.path.join(workdir, f"out-{name}"), num_workers=2, max_steps=cfg.steps,
        per_device_train_batch_size=cfg.batch, learning_rate=cfg.lr, optim="adamw_torch",
        max_grad_norm=cfg.max_grad_norm, save_strategy="no", disable_tqdm=True, seed=cfg.seed, **extra)
    trainer = timed(model=build_model(cfg), args=args, train_dataset=build_dataset(cfg),
                    callbacks=[c() for c in callbacks])
    trainer.stamp_dir = stamp_dir
    trainer.pop_callback(raytrainer.PrinterCallback)
    t0 = time.time()
    output = trainer.train()
    total = time.time() - t0
    files = [f for f in os.listdir(stamp_dir) if f.startswith("rank0-")]
    stamps = common.read_stamps(os.path.join(stamp_dir, files[0]))
    stamps["train_loss"] = output.training_loss
    return {**_result(stamps, t0, total, cfg), "control_points": sorted(trainer.callback_handler.control_points())}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--json", default=None)
    opts = parser.parse_args(argv)
    cfg = Config(steps=opts.steps or (120 if opts.quick else 300))
    repeats = opts.repeats or (1 if opts.quick else 2)
    names = opts.variants.split(",")
    common.ship_by_value()
    common.start_ray(num_cpus=4)
    results = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="rt-events-") as workdir:
        for _ in range(repeats):
            for name in names:
                results[name].append(run(cfg, workdir, name))
    common.stop_ray()
    rows = []
    for name in names:
        for i, r in enumerate(results[name]):
            base = results["off"][i]["median_ms"] if "off" in results else float("nan")
            rows.append([name, i + 1, r["median_ms"], r["median_ms"] / base, ",".join(r["control_points"]) or "-",
                         r["train_loss"]])
    common.print_table(f"Event streaming overhead, 2 workers, {cfg.steps} steps ({os.getloadavg()[0]:.1f} load)",
                       ["variant", "round", "median step ms", "ratio to off", "control points", "train loss"], rows)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"config": cfg.__dict__, "results": results}, f, indent=2, default=str)


if __name__ == "__main__":
    main()
