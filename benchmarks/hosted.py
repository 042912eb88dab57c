"""The hosted mode's cost: one TRL SFT script (or `--script plain` / `llama`: a plain transformers.Trainer with a
tiny MLP / Llama) under torchrun and under `raytrainer launch`, 2 processes each (`--workers`).

    python benchmarks/hosted.py                 # 3 pairs of 200 steps: ~3-4 min on 2 cores
    python benchmarks/hosted.py --script plain --steps 1500 --torchrun-alone  # 5 ms steps: ~4 min
    python benchmarks/hosted.py --steps 300 --pairs 5 --json /tmp/hosted.json
    python benchmarks/hosted.py --torchrun-alone  # Ray stopped while torchrun runs: ~5-6 min
    python benchmarks/hosted.py --workers 1       # one rank: launch runs a plain process, torchrun DDP of one
    python benchmarks/hosted.py --cli --script llama --steps 1200 --pairs 5  # the command as typed: ~7 min

The script (benchmarks/hosted_sft.py, hosted_plain.py or gpu_hosted_script.py) stamps, on rank 0, its own start
(before its imports), train begin and every step end. Ray and the worker group are started first by one untimed
launch (its start-up is reported); then each pair runs torchrun and `raytrainer launch` (on the warm group) one
after the other, in alternating order (t h, h t, ...), so a host whose speed drifts by minutes weighs on both sides
alike. Reported per run:
  steady step    the median step time over the steps after the first 20% (the same code runs in both:
                 HF's loop, DDP over gloo; the difference is what hosting adds per step)
  rank cpu       CPU time per step of each rank's process (all its threads), read from /proc over the steady
                 steps: what the rank itself spends, which the machine's other load barely moves
  others         CPU cores used meanwhile by every other process this benchmark started (Ray's, the driver's
                 pump; the sampler's own thread left out): on 2 cores, taken from the ranks' time
  start-up       call -> script start (torchrun: its processes; launch: the job's dispatch to the warm group),
                 script start -> train begin (imports, model, data), train begin -> first step end
Ratio (reported, not asserted): hosted / torchrun steady step per pair, and its median; target <= 1.05.
`--baseline bare` puts two bare Ray actors in torchrun's place (hosted_ladder.ScriptHost, 0 CPUs each: the
script in a thread of the actor with torchrun's RANK, WORLD_SIZE and MASTER_* variables, accelerate making the
gloo group, the call waiting on the actor's main thread): Ray's worker processes without Ray Train or raytrainer,
so the ratio is what Ray Train's worker and raytrainer's hosting add (`python benchmarks/hosted.py --baseline
bare --pairs 6`). `--baseline raytrain` puts the script in a plain Ray Train `TorchTrainer` (2 workers, its own gloo
group, no raytrainer; the launch's idle group is released first for its CPUs, so each launch starts a new group:
neither start is in the steady step): the ratio is what raytrainer's hosting adds to Ray Train's worker.
By default torchrun runs beside the idle Ray instance and worker group (their idle CPU is in its "others"):
the ratio is what hosting adds to a machine where Ray runs anyway. `--torchrun-alone` stops Ray (and the
group) before each torchrun run and starts both again for the launch (a new group each time, whose start is
not in the steady step): the ratio a user who runs torchrun on a machine of its own compares with. `--cli` runs
`raytrainer launch --num_workers W script ...` as a command in a process of its own, which starts its own Ray and
group each time and stops them at its end (nothing of Ray's runs beside torchrun): what a user who types either
command compares; its call_s holds Ray's start and stop.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import common

sys.path.insert(0, common.REPO_ROOT)
HERE = os.path.dirname(os.path.abspath(__file__))
# --script: the file timed and the arguments it always takes
SCRIPTS = {"sft": ("hosted_sft.py", ()), "plain": ("hosted_plain.py", ()),
           "llama": ("gpu_hosted_script.py", ("--size", "smoke"))}
SCRIPT = os.path.join(HERE, "hosted_sft.py")  # the script timed (--script, set once by main)
SCRIPT_ARGS: tuple = ()  # its fixed arguments (set with SCRIPT)
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
WORKERS = 2  # ranks on each side (--workers, set once by main)


class ProcessCPU(common.BackgroundThread):
    """CPU seconds of every process this one started (children of children included), sampled every
    `every_s` in a thread: the ranks (the processes whose command line holds `rank_marker`: the script's path
    under torchrun, RayTrainWorker under Ray; an idle worker group beside torchrun is among the others) apart
    from the others. The sampler's own CPU is counted apart so that it can be taken out of this process's."""

    def __init__(self, rank_marker: bytes, every_s: float = 1.0):
        super().__init__("hosted-bench-cpu")
        self.rank_marker, self.every_s, self.samples, self.own_s = rank_marker, every_s, [], 0.0

    def _run(self):
        while not self._done.is_set():
            start = time.thread_time()
            ranks, others = self._read()
            self.own_s += time.thread_time() - start
            self.samples.append((time.time(), ranks, others, self.own_s))
            self._done.wait(self.every_s)

    def _read(self):
        """(CPU s of the rank processes, CPU s of the others): descendants of this process, this one included."""
        table = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    text = f.read()
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    command = f.read()
            except OSError:
                continue
            fields = text[text.rindex(")") + 2:].split()
            table[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) * TICK_S,
                                 self.rank_marker in command)
        children = {}
        for pid, (parent, _, _) in table.items():
            children.setdefault(parent, []).append(pid)
        ranks = others = 0.0
        todo = [os.getpid()]
        while todo:
            pid = todo.pop()
            _, cpu, is_rank = table.get(pid, (0, 0.0, False))
            if is_rank:
                ranks += cpu
            else:
                others += cpu
            todo.extend(children.get(pid, ()))
        return ranks, others

    def over(self, steps: list) -> dict:
        """Over the samples inside the steady steps: each rank's CPU ms per step, the others' cores."""
        inside = [s for s in self.samples if steps[0] <= s[0] <= steps[-1]]
        if len(inside) < 2:
            return {"rank_cpu_ms": None, "other_cores": None}
        (t0, r0, o0, own0), (t1, r1, o1, own1) = inside[0], inside[-1]
        count = sum(1 for t in steps if t0 < t <= t1)
        return {"rank_cpu_ms": 1000 * (r1 - r0) / WORKERS / max(count, 1),
                "other_cores": ((o1 - o0) - (own1 - own0)) / (t1 - t0)}


def stamps_path(root: str, tag: str) -> str:
    return os.path.join(root, f"{tag}.json")


def script_argv(steps: int, root: str, tag: str) -> list:
    """The timed script's arguments for one run: its output folder and stamps file named by `tag`."""
    return ["--output_dir", os.path.join(root, tag), "--max_steps", str(steps), "--stamps", stamps_path(root, tag),
            *SCRIPT_ARGS]


def run_figures(root: str, tag: str, called: float, cpu: ProcessCPU) -> dict:
    """One run's figures once it has ended (`called`: when it was started): common.script_phases of the stamps
    its script wrote, and the CPU the processes used over the same steady steps."""
    with open(stamps_path(root, tag)) as f:
        stamps = json.load(f)
    steps = stamps["steps"]
    return {**common.script_phases(stamps, called), **cpu.over(steps[(len(steps) - 1) // 5:]),
            "call_s": time.time() - called}


def run_command(command: list, rank_marker: bytes, steps: int, root: str, tag: str) -> dict:
    """`command` + the script and its arguments, in a process of its own; its ranks found by `rank_marker`."""
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    log = os.path.join(root, f"{tag}.log")
    called = time.time()
    with ProcessCPU(rank_marker) as cpu, open(log, "w") as out:
        done = subprocess.run([*command, SCRIPT, *script_argv(steps, root, tag)], env=env, stdout=out,
                              stderr=subprocess.STDOUT)
    if done.returncode:
        with open(log) as f:
            raise SystemExit(f"{' '.join(command)} failed (exit {done.returncode}); its output ends:\n"
                             f"{f.read()[-3000:]}")
    return run_figures(root, tag, called, cpu)


def run_torchrun(steps: int, root: str) -> dict:
    return run_command(common.torchrun_command(WORKERS), SCRIPT.encode(), steps, root, "torchrun")


def run_cli(steps: int, root: str, tag: str) -> dict:
    """`raytrainer launch` as a user types it: a process of its own that starts its own Ray (`--cli`)."""
    command = [sys.executable, "-m", "raytrainer", "launch", "--num_workers", str(WORKERS)]
    return run_command(command, b"RayTrainWorker", steps, root, tag)


_BARE: list = []  # the two bare actors, started by the first bare run and kept (as the warm group is)


def run_bare(steps: int, root: str, tag: str) -> dict:
    """The script in two bare Ray actors, as torchrun's two ranks (see the module's doc)."""
    import hosted_ladder
    import ray
    import ray.cloudpickle

    if not _BARE:
        ray.cloudpickle.register_pickle_by_value(hosted_ladder)  # the workers have no benchmarks/ on their path
        _BARE.extend(ray.remote(num_cpus=0)(hosted_ladder.ScriptHost).remote() for _ in range(WORKERS))
    port = common.free_port()
    argv = script_argv(steps, root, tag)
    called = time.time()
    with ProcessCPU(b"ScriptHost") as cpu:
        ray.get([actor.run.remote(SCRIPT, argv, {
            **hosted_ladder.job_env("cpu"), "RANK": str(rank), "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(WORKERS), "LOCAL_WORLD_SIZE": str(WORKERS), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port)})
            for rank, actor in enumerate(_BARE)])
    return run_figures(root, tag, called, cpu)


def _script_in_ray_train(config: dict):
    """Ray Train's train function of `--baseline raytrain`: the script as `python script ARGS` would run it."""
    os.environ.update(config["env"])
    config["run"](config["script"], config["argv"])  # hosted_ladder.run_as_main, shipped by value


def run_raytrain(steps: int, root: str, tag: str) -> dict:
    """The script in a plain Ray Train TorchTrainer of WORKERS workers (see the module's doc)."""
    import hosted_ladder
    import ray.cloudpickle
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from raytrainer.coordinator import holders

    ray.cloudpickle.register_pickle_by_value(hosted_ladder)  # the workers have no benchmarks/ on their path
    holders.release_all()  # the launch's idle group holds the CPUs its workers need
    argv = script_argv(steps, root, tag)
    called = time.time()
    with ProcessCPU(b"RayTrainWorker") as cpu:
        config = {"script": SCRIPT, "argv": argv, "run": hosted_ladder.run_as_main,
                  "env": {"ACCELERATE_USE_CPU": "true"}}
        TorchTrainer(_script_in_ray_train, train_loop_config=config,
                     scaling_config=ScalingConfig(num_workers=WORKERS),
                     run_config=RunConfig(name=tag, storage_path=root)).fit()
    return run_figures(root, tag, called, cpu)


def run_launch(steps: int, root: str, tag: str) -> dict:
    import raytrainer

    called = time.time()
    with ProcessCPU(b"RayTrainWorker") as cpu:
        raytrainer.launch(SCRIPT, script_argv(steps, root, tag), num_workers=WORKERS, disable_tqdm=True,
                          resume=False)
    return run_figures(root, tag, called, cpu)


def start_ray():
    """Ray as `raytrainer launch` starts it; the seconds it took, None where it was running."""
    import ray

    from raytrainer.coordinator import cluster

    if ray.is_initialized():
        return None
    started = time.time()
    cluster.connect()
    return time.time() - started


def stop_ray():
    """The worker group, then Ray: nothing of Ray's left to share the cores with torchrun."""
    import ray

    from raytrainer.coordinator import holders

    holders.release_all()
    ray.shutdown()


# --baseline: the row name of what stands in torchrun's place.
BASELINES = {"torchrun": "torchrun", "bare": "two bare Ray actors", "raytrain": "a plain Ray Train TorchTrainer"}


def row(pair, name: str, figures: dict, load: float) -> list:
    return [pair, name, common.fmt(figures["steady_step_ms"]), common.fmt(figures["rank_cpu_ms"]),
            common.fmt(figures["other_cores"]), common.fmt(figures["to_script_s"]), common.fmt(figures["script_s"]),
            common.fmt(figures["first_step_s"]), common.fmt(figures["call_s"]), f"{load:.1f}"]


def main():
    global WORKERS, SCRIPT, SCRIPT_ARGS
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--torchrun-alone", action="store_true", help="no Ray running while torchrun runs")
    parser.add_argument("--baseline", choices=tuple(BASELINES), default="torchrun",
                        help="what launch is compared with: torchrun, two bare Ray actors, or a plain Ray Train "
                             "TorchTrainer (see above)")
    parser.add_argument("--workers", type=int, default=WORKERS, help="ranks on each side (default 2)")
    parser.add_argument("--script", choices=tuple(SCRIPTS), default="sft",
                        help="hosted_sft.py (TRL's SFTTrainer, ~40 ms steps), hosted_plain.py (a plain "
                             "transformers.Trainer, ~5 ms steps: a launcher's per-step cost shows) or llama "
                             "(gpu_hosted_script.py --size smoke: a plain Trainer on a tiny Llama, ~17 ms steps)")
    parser.add_argument("--cli", action="store_true",
                        help="run `raytrainer launch` as a command, in a process of its own with its own Ray, as "
                             "a user types it (each launch starts Ray and a group; no Ray in this process)")
    parser.add_argument("--json")
    options = parser.parse_args()
    if options.cli and options.baseline != "torchrun":
        parser.error("--cli compares the command with torchrun: leave --baseline out")
    WORKERS = options.workers
    SCRIPT, SCRIPT_ARGS = os.path.join(HERE, SCRIPTS[options.script][0]), SCRIPTS[options.script][1]
    from raytrainer.coordinator import holders

    rows, ratios, runs = [], [], []
    base = BASELINES[options.baseline]  # the baseline's row name
    with tempfile.TemporaryDirectory() as root:
        ray_s, first = None, None
        if not options.cli:
            ray_s = start_ray()
            first = run_launch(options.steps, root, "launch-first")  # the group's start: not in a pair
            rows.append(row("-", "raytrainer launch (new group)", first, os.getloadavg()[0]))
        for pair in range(options.pairs):
            order = ("torchrun", "launch") if pair % 2 == 0 else ("launch", "torchrun")
            figures = {}
            for name in order:
                if name == "torchrun" and options.baseline == "bare":
                    figures[name] = run_bare(options.steps, root, f"bare-{pair}")
                elif name == "torchrun" and options.baseline == "raytrain":
                    figures[name] = run_raytrain(options.steps, root, f"raytrain-{pair}")
                elif name == "torchrun":
                    if options.torchrun_alone:
                        stop_ray()
                    figures[name] = run_torchrun(options.steps, root)
                elif options.cli:
                    group = "the command, its own Ray"
                    figures[name] = run_cli(options.steps, root, f"launch-{pair}")
                else:
                    group = "new group" if start_ray() is not None or not holders.idle_groups() else "warm group"
                    figures[name] = run_launch(options.steps, root, f"launch-{pair}")
                rows.append(row(pair, base if name == "torchrun" else f"raytrainer launch ({group})",
                                figures[name], os.getloadavg()[0]))
            ratios.append(figures["launch"]["steady_step_ms"] / figures["torchrun"]["steady_step_ms"])
            runs.append(figures)
            print(f"[pair {pair + 1}/{options.pairs}] hosted / {options.baseline} {ratios[-1]:.3f} "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
    beside = "torchrun with no Ray running" if options.torchrun_alone or options.cli else \
        "torchrun beside the idle Ray and group"
    if options.baseline != "torchrun":
        beside = f"{base} in torchrun's place"
    ray_start = "each launch starts its own Ray" if options.cli else f"Ray start: {ray_s:.1f} s"
    common.print_table(f"{os.path.basename(SCRIPT)}, {WORKERS} process(es), {options.steps} steps, {beside} "
                       f"({ray_start})",
                       ["pair", "launcher", "steady_step_ms", "rank_cpu_ms", "other_cores", "to_script_s",
                        "script_s", "first_step_s", "call_s", "load"],
                       rows, notes=[f"hosted / {options.baseline} steady step, per pair: "
                                    f"{', '.join(f'{r:.3f}' for r in ratios)}; median {statistics.median(ratios):.3f}"
                                    " (target <= 1.05)"])
    common.write_json(options.json, {"machine": common.machine_info(), "rows": rows, "ratios": ratios,
                                     "runs": runs, "first_launch": first, "ray_start_s": ray_s,
                                     "torchrun_alone": options.torchrun_alone, "cli": options.cli,
                                     "baseline": options.baseline, "workers": WORKERS,
                                     "script": os.path.basename(SCRIPT)})


if __name__ == "__main__":
    main()
