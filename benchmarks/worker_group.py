"""What a Trainer's kept worker group saves: call latency on 2 workers, against bare Ray Train's start-up.

    python benchmarks/worker_group.py            # ~2 min on 2 cores
    python benchmarks/worker_group.py --json /tmp/worker_group.json

In one embedded Ray (4 logical CPUs, with the dashboard, for `ray.util.state`):
  bare fit()     a Ray Train V2 TorchTrainer, 2 workers, gloo, whose function records the time and returns:
                 what any group start costs (3 runs, the median)
  first train()  the Trainer's first call: starts its group (40 steps of the 1.5 M-parameter MLP)
  evaluate() x3, predict(), a second train(): the calls after it, on the same group
  later Trainers a second Trainer of the same shape, a third with FSDP (same shape), a fourth with 1 worker:
                 the first two take the idle group from the process's pool, the fourth starts its own
  per call       evaluate() with worker_idle_timeout_s=0: a new group for every call, as before the group
                 was kept
"to first step" is from the call to the first training_step / prediction_step on rank 0 (a wall-clock stamp
the worker writes; every process is on this machine), "to result" until the call returns. Then the idle
group's cost (CPU time and resident memory of its worker processes over 10 s) and the release: close()'s
duration and how long until `ray.util.state.list_actors` shows none of our actors alive (RayTrainWorker,
TrainController, EventSink). Target: later calls <= 2.5 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import common
import torch

sys.path.insert(0, common.REPO_ROOT)

OURS = {"RayTrainWorker", "TrainController", "EventSink"}


def stamp_class():
    import raytrainer

    class Stamped(raytrainer.Trainer):
        """Writes the wall time of its first training / prediction step of each call on rank 0."""
        stamp_dir = ""

        def _stamp(self, kind):
            if self.ctx.rank == 0 and not getattr(self, "_stamped", False):
                self._stamped = True  # each call brings a fresh copy of the trainer: once per call
                with open(os.path.join(self.stamp_dir, f"{kind}-{time.time():.6f}"), "w"):
                    pass

        def training_step(self, model, inputs, num_items_in_batch=None):
            self._stamp("step")
            return super().training_step(model, inputs, num_items_in_batch=num_items_in_batch)

        def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
            self._stamp("step")
            return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)

    return Stamped


def first_stamp_after(stamp_dir: str, since: float):
    times = [float(n.split("-", 1)[1]) for n in os.listdir(stamp_dir)]
    later = [t for t in times if t >= since]
    return min(later) - since if later else None


def bare_fit_startup(runs: int = 3) -> dict:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    def entered(config):
        import ray.train

        if ray.train.get_context().get_world_rank() == 0:
            with open(config["path"], "w") as f:
                f.write(str(time.time()))

    firsts, totals = [], []
    with tempfile.TemporaryDirectory() as work:
        for i in range(runs):
            path = os.path.join(work, f"entered-{i}")
            t0 = time.time()
            TorchTrainer(entered, train_loop_config={"path": path}, scaling_config=ScalingConfig(num_workers=2),
                         run_config=RunConfig(name=f"bare-{i}", storage_path=work)).fit()
            totals.append(time.time() - t0)
            with open(path) as f:
                firsts.append(float(f.read()) - t0)
    return {"to_first_step": statistics.median(firsts), "to_result": statistics.median(totals),
            "runs": list(zip(firsts, totals))}


def timed(stamp_dir: str, call) -> dict:
    t0 = time.time()
    call()
    return {"to_first_step": first_stamp_after(stamp_dir, t0), "to_result": time.time() - t0}


def worker_processes():
    import psutil
    import ray._private.state

    pids = [a["Pid"] for a in ray._private.state.actors().values()
            if a["State"] == "ALIVE" and a["ActorClassName"] == "RayTrainWorker"]
    return [psutil.Process(pid) for pid in pids]


def idle_cost(seconds: float = 10.0) -> dict:
    procs = worker_processes()
    cpu0 = [sum(p.cpu_times()[:2]) for p in procs]
    time.sleep(seconds)
    cpu = sum(sum(p.cpu_times()[:2]) - c for p, c in zip(procs, cpu0))
    return {"workers": len(procs), "cpu_percent_per_worker": 100 * cpu / seconds / max(1, len(procs)),
            "rss_mib_per_worker": statistics.mean(p.memory_info().rss for p in procs) / 2**20 if procs else None}


# A bare fit() called on the main thread leaves its controller actor alive: Ray Train's SIGINT handler keeps
# a handle to it. Those are not the Trainer's, so they are left out by id.
BASELINE_ACTORS: set = set()


def live_actors_of_ours() -> list:
    from ray.util.state import list_actors

    return [a.class_name for a in list_actors(filters=[("state", "=", "ALIVE")])
            if a.class_name in OURS and a.actor_id not in BASELINE_ACTORS]


def seconds_until_none_alive(since: float, timeout_s: float = 30.0) -> dict:
    """From `since` until ray.util.state lists none of our actors alive (it lags the GCS by up to ~1 s)."""
    while (alive := live_actors_of_ours()) and time.time() - since < timeout_s:
        time.sleep(0.25)
    return {"seconds": time.time() - since, "alive": alive}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    cli = parser.parse_args()
    common.quiet_ray_logs()
    common.ship_by_value()
    ray_start_s = common.start_ray(num_cpus=4, dashboard=True)
    from raytrainer import TrainingArguments

    Stamped = stamp_class()
    rows, results = [], {"machine": common.machine_info(), "ray_start_s": ray_start_s}
    bare = results["bare_fit"] = bare_fit_startup()
    rows.append(["bare Ray Train fit()", bare["to_first_step"], bare["to_result"], 1.0])
    from ray.util.state import list_actors

    BASELINE_ACTORS.update(a.actor_id for a in list_actors(filters=[("state", "=", "ALIVE")]))

    with tempfile.TemporaryDirectory() as work:
        stamps = os.path.join(work, "stamps")
        os.makedirs(stamps)
        Stamped.stamp_dir = stamps
        data = common.SyntheticDataset(2048, 512, 16)

        def trainer(idle_timeout_s, name="", **extra):
            args = TrainingArguments(**{**dict(
                output_dir=os.path.join(work, f"run-{idle_timeout_s}{name}"), num_workers=2,
                per_device_train_batch_size=32, max_steps=40, save_strategy="no", logging_steps=20,
                disable_tqdm=True, report_to=[], worker_idle_timeout_s=idle_timeout_s), **extra})
            return Stamped(model=common.MLP(), args=args, train_dataset=data,
                           eval_dataset=common.SyntheticDataset(256, 512, 16, seed=7))

        kept = trainer(300)
        calls = [("first train()", kept.train), ("evaluate() #1", kept.evaluate),
                 ("predict()", lambda: kept.predict(common.SyntheticDataset(256, 512, 16, seed=8))),
                 ("evaluate() #2", kept.evaluate), ("evaluate() #3", kept.evaluate), ("second train()", kept.train)]
        for name, call in calls:
            figures = results[name] = timed(stamps, call)
            rows.append([name, figures["to_first_step"], figures["to_result"],
                         figures["to_result"] / bare["to_result"]])
        idle = results["idle"] = idle_cost()
        # Later Trainers of the same script take the idle group from the process's pool when their shape
        # (workers, resources, ...) fits, whatever their strategy; another shape starts a group of its own.
        later = [("second Trainer, same shape", trainer(300, "-same")),
                 ("third Trainer, FSDP, same shape", trainer(300, "-fsdp", strategy="fsdp")),
                 ("fourth Trainer, other shape (1 worker)", trainer(300, "-one", num_workers=1))]
        for name, other in later:
            figures = results[name] = timed(stamps, other.train)
            rows.append([name, figures["to_first_step"], figures["to_result"],
                         figures["to_result"] / bare["to_result"]])
        later[2][1].close()  # the 1-worker group
        kept.close()  # a no-op: a later Trainer used the group since
        t0 = time.time()
        later[1][1].close()  # the Trainer that used the 2-worker group last releases it
        results["close_s"] = time.time() - t0
        results["after_close"] = seconds_until_none_alive(t0)

        per_call = trainer(0)
        per_call.evaluate()  # as a later call: evaluation data already built, Ray warm
        figures = results["evaluate() per call"] = timed(stamps, per_call.evaluate)
        rows.append(["evaluate(), a group per call", figures["to_first_step"], figures["to_result"],
                     figures["to_result"] / bare["to_result"]])
        results["after_idle_0"] = seconds_until_none_alive(time.time())

    common.print_table("Call latency on 2 workers (seconds)", ["call", "to first step", "to result",
                                                                "result / bare fit()"], rows, notes=[
        f"idle group: {idle['workers']} workers, {idle['cpu_percent_per_worker']:.2f} % CPU and "
        f"{idle['rss_mib_per_worker']:.0f} MiB resident each",
        f"close(): {results['close_s']:.2f} s; none of our actors listed alive "
        f"{results['after_close']['seconds']:.1f} s after the call (still alive: {results['after_close']['alive']}); "
        f"after a worker_idle_timeout_s=0 call: {results['after_idle_0']['seconds']:.1f} s after its return (still "
        f"alive: {results['after_idle_0']['alive']})",
        f"Ray start {ray_start_s:.1f} s (not in any figure); torch {torch.__version__}"])
    common.write_json(cli.json, results)
    common.stop_ray()


if __name__ == "__main__":
    main()
