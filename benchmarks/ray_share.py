"""What each part of Ray and of the hosted mode costs a running 2-rank job, measured inside one long run.

    python benchmarks/ray_share.py                          # every freeze set and ablation: ~15 min on 2 cores
    python benchmarks/ray_share.py --freeze all --freeze none --launcher torchrun   # ~4 min
    python benchmarks/ray_share.py --ablate exchange --ablate none --json /tmp/share.json
    python benchmarks/ray_share.py --idle ours --idle none --idle ranks:0   # ~6 min

hosted.py compares separate runs, and on a host whose speed drifts 20-40 % within the hour its pairs spread
from 0.79 to 1.31: a part that costs 1-5 % cannot be seen there. Here the comparison is inside one run of
hosted_sft.py (1500 steps by default), in alternate windows, so that a drifting host weighs on both sides alike:

  --freeze SET  Ray and the worker group started (and warm), then one run under `--launcher` (torchrun beside
                that idle Ray, or `raytrainer launch` on the group) while every WINDOW_S seconds the processes of
                SET are stopped (SIGSTOP) or let run again (SIGCONT): the steps inside stopped windows against
                the steps inside running ones. SET: all (every process of Ray's but the ranks and this driver:
                the raylet, GCS, dashboard, Ray Train's actors, the event sink), dashboard (its head, its module
                processes and the node's agent), train (Ray Train's controller, its synchronization actor, Ray
                Data's autoscaling coordinator), idle (Ray's idle worker processes), sink (raytrainer's event sink),
                ours (the sink, Ray Train's controller and synchronization actor: the group's bookkeeping),
                actors (every Ray actor but the ranks), core (the raylet, GCS and log monitor), ranks (the
                ranks themselves), none (nothing stopped: the method's noise).
  --idle SET    as --freeze, but the set's threads run at SCHED_IDLE in the "stopped" windows instead of being
                stopped (SET:N: at niceness N instead; `ranks:0` raises the ranks from Ray's worker niceness 15):
                whether a scheduling class takes a part's cost off the step without taking the part away.
  --ablate WHAT one `raytrainer launch` run of hosted_ablate.py, which switches a part of the rank's own per-step
                work off in alternate blocks of steps (exchange, relay) or windows (park); none: the noise.

Reported per set: the median (and mean) step inside the windows with the part present and with it stopped or
off, their counts, and the ratio present / absent: what that part costs the step. Steps that straddle a window's
edge (and the first 0.3 s after one) are left out. Ratios, not timings: nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time

import common
import hosted
import hosted_ablate

WINDOW_S = hosted_ablate.WINDOW_S
SETTLE_S = 0.3  # after a window's edge: a stopped process resumes, the ranks catch up
ABLATE_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hosted_ablate.py")


def _argv0(command: bytes) -> bytes:
    return command.split(b"\0")[0]


FREEZE_SETS = {
    "all": lambda c: (b"ray::" in c and b"RayTrainWorker" not in c)
    or _argv0(c).endswith((b"/raylet", b"/gcs_server"))
    or any(m in c for m in (b"ray-dashboard", b"dashboard/dashboard.py", b"log_monitor",
                            b"autoscaler/_private/monitor")),
    "dashboard": lambda c: b"ray-dashboard" in c or b"dashboard/dashboard.py" in c or b"ray::DashboardAgent" in c,
    "train": lambda c: any(m in c for m in (b"ray::TrainController", b"ray::SynchronizationActor",
                                            b"ray::_AutoscalingCoordinatorActor")),
    "idle": lambda c: b"ray::IDLE" in c,
    "actors": lambda c: b"ray::" in c and b"RayTrainWorker" not in c,
    "core": lambda c: _argv0(c).endswith((b"/raylet", b"/gcs_server")) or b"log_monitor" in c,
    "sink": lambda c: b"ray::EventSink" in c,
    "ranks": lambda c: b"RayTrainWorker" in c,
    "ours": lambda c: any(m in c for m in (b"ray::EventSink", b"ray::TrainController",
                                           b"ray::SynchronizationActor")),
    "none": lambda c: False,
}


def processes(belongs) -> list:
    """The pids (other than this process) whose command line `belongs(cmdline)` says are in the set."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read()
        except OSError:
            continue
        if belongs(command):
            found.append(int(entry))
    return found


class Freezer(common.BackgroundThread):
    """Stops and resumes `pids` every WINDOW_S seconds (after `delay_s`) in a thread; `windows`: (start, stopped)."""

    def __init__(self, pids: list, delay_s: float = 8.0):
        super().__init__("ray-share-freezer")
        self.pids, self.delay_s, self.windows = pids, delay_s, []

    def __exit__(self, *exc):
        super().__exit__(*exc)
        self.switch(False)  # whatever happened, nothing of Ray's is left stopped

    def switch(self, stopped: bool):
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGSTOP if stopped else signal.SIGCONT)
            except OSError:  # gone (an idle worker Ray ended)
                pass

    def _run(self):
        if self._done.wait(self.delay_s):
            return
        stopped = False
        while not self._done.is_set():
            stopped = not stopped
            self.switch(stopped)
            self.windows.append((time.time(), stopped))
            self._done.wait(WINDOW_S)


class Idler(Freezer):
    """As Freezer, but instead of stopping `pids` puts every thread of theirs at SCHED_IDLE (they run only on a
    core nothing else wants; `nice` None) or at niceness `nice` in the "stopped" windows, and back to its own
    scheduling class and niceness in the others."""

    def __init__(self, pids: list, delay_s: float = 8.0, nice=None):
        super().__init__(pids, delay_s)
        self.to_nice = nice
        self.own = {tid: (os.sched_getscheduler(tid), os.getpriority(os.PRIO_PROCESS, tid)) for tid in self._threads()}

    def _threads(self) -> list:
        found = []
        for pid in self.pids:
            try:
                found += [int(t) for t in os.listdir(f"/proc/{pid}/task")]
            except OSError:
                pass
        return found

    def switch(self, stopped: bool):
        for tid in self._threads():
            policy, nice = self.own.get(tid, (os.SCHED_OTHER, 15))  # a thread started since: Ray's worker nice
            try:
                if stopped and self.to_nice is None:
                    os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
                elif stopped:
                    os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))
                    os.setpriority(os.PRIO_PROCESS, tid, self.to_nice)
                else:
                    os.sched_setscheduler(tid, policy, os.sched_param(0))
                    os.setpriority(os.PRIO_PROCESS, tid, nice)
            except OSError:  # a thread that ended
                pass


def split_by_windows(steps: list, windows: list) -> dict:
    """Step durations inside windows where the part ran (False) or was stopped (True)."""
    edges = [(start, windows[i + 1][0] if i + 1 < len(windows) else float("inf"), stopped)
             for i, (start, stopped) in enumerate(windows)]
    split = {False: [], True: []}
    for begin, end in zip(steps, steps[1:]):
        for start, stop, stopped in edges:
            if begin >= start + SETTLE_S and end <= stop:
                split[stopped].append(end - begin)
                break
    return split


def split_by_blocks(steps: list) -> dict:
    """Step durations in the blocks where the ablated part ran (False) or was off (True), as hosted_ablate.py
    counts them: the n-th step's begin (n from 1) is in an off block when (n // BLOCK) is odd. The steps at a
    block's edge are left out."""
    split = {False: [], True: []}
    for index in range(1, len(steps)):
        n = index + 1  # steps[index] ends the (index + 1)-th step
        if n % hosted_ablate.BLOCK in (0, 1, hosted_ablate.BLOCK - 1):
            continue
        split[(n // hosted_ablate.BLOCK) % 2 == 1].append(steps[index] - steps[index - 1])
    return split


def clock_windows(steps: list) -> list:
    """hosted_ablate.py's park windows over the run's steps, as split_by_windows takes them: WINDOW_S seconds of
    wall-clock time each, the main thread parked (the part absent) in the even ones."""
    first, last = int(steps[0] // WINDOW_S), int(steps[-1] // WINDOW_S)
    return [(k * WINDOW_S, k % 2 == 0) for k in range(first, last + 1)]


def summary(name: str, split: dict) -> dict:
    present, absent = split[False], split[True]
    if len(present) < 20 or len(absent) < 20:
        raise SystemExit(f"{name}: too few steps inside windows ({len(present)} and {len(absent)}): use more --steps")
    result = {"set": name, "present_ms": 1000 * statistics.median(present),
              "absent_ms": 1000 * statistics.median(absent), "present_mean_ms": 1000 * statistics.mean(present),
              "absent_mean_ms": 1000 * statistics.mean(absent), "n_present": len(present), "n_absent": len(absent)}
    result["ratio"] = result["present_ms"] / result["absent_ms"]
    result["ratio_of_means"] = result["present_mean_ms"] / result["absent_mean_ms"]
    print(f"[{name}] present / absent {result['ratio']:.3f} (means {result['ratio_of_means']:.3f})", flush=True)
    return result


def run_frozen(name: str, launcher: str, steps: int, root: str, idle: bool = False) -> dict:
    """One run with the set `name` stopped in alternate windows, or with `idle` at SCHED_IDLE (`SET:N`: at
    niceness N) instead."""
    name, _, nice = name.partition(":")
    pids = processes(FREEZE_SETS[name])
    if name != "none" and not pids:
        raise SystemExit(f"--{'idle' if idle else 'freeze'} {name}: no such process running")
    verb = (f"nice {nice}" if nice else "idle") if idle else "freeze"
    tag = f"{verb}-{name}-{launcher}"
    with (Idler(pids, nice=int(nice) if nice else None) if idle else Freezer(pids)) as freezer:
        figures = hosted.run_torchrun(steps, root) if launcher == "torchrun" else hosted.run_launch(steps, root, tag)
    stamps = os.path.join(root, "torchrun.json" if launcher == "torchrun" else f"{tag}.json")
    with open(stamps) as f:
        split = split_by_windows(json.load(f)["steps"], freezer.windows)
    result = summary(f"{verb} {name} ({launcher}, {len(pids)} processes)", split)
    return {**result, "steady_step_ms": figures["steady_step_ms"]}


def run_ablated(what: str, steps: int, root: str) -> dict:
    import raytrainer

    tag = f"ablate-{what}"
    stamps = os.path.join(root, f"{tag}.json")
    raytrainer.launch(ABLATE_SCRIPT, ["--ablate", what, "--output_dir", os.path.join(root, tag), "--max_steps",
                                      str(steps), "--stamps", stamps], num_workers=hosted.WORKERS, disable_tqdm=True,
                      resume=False)
    with open(stamps) as f:
        done = json.load(f)["steps"]
    split = split_by_windows(done, clock_windows(done)) if what == "park" else split_by_blocks(done)
    return summary(f"ablate {what} (launch)", split)


def idle_set(value: str) -> str:
    """--idle's argument: a set of FREEZE_SETS, optionally `:N` with an int niceness."""
    name, colon, nice = value.partition(":")
    if name not in FREEZE_SETS or (colon and not nice.lstrip("-").isdigit()):
        raise argparse.ArgumentTypeError(f"{value!r}: one of {', '.join(FREEZE_SETS)}, optionally :N with an int "
                                         "niceness N (e.g. ranks:0)")
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--freeze", action="append", choices=tuple(FREEZE_SETS), default=[])
    parser.add_argument("--idle", action="append", type=idle_set, default=[],
                        help="as --freeze, but the set runs at SCHED_IDLE in alternate windows instead of stopped "
                             "(SET:N: at niceness N)")
    parser.add_argument("--ablate", action="append", choices=("exchange", "relay", "park", "none"), default=[])
    parser.add_argument("--launcher", choices=("launch", "torchrun"), default="launch",
                        help="what runs while a --freeze set is stopped and resumed (default: raytrainer launch)")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--json")
    options = parser.parse_args()
    if not options.freeze and not options.ablate and not options.idle:
        options.freeze, options.ablate = ["all", "dashboard", "train", "sink", "none"], ["exchange", "relay", "park",
                                                                                        "none"]
    results = []
    with tempfile.TemporaryDirectory() as root:
        ray_s = hosted.start_ray()
        hosted.run_launch(5, root, "warm")  # the group started: its processes are among the sets
        for name in options.freeze:
            results.append(run_frozen(name, options.launcher, options.steps, root))
        for name in options.idle:
            results.append(run_frozen(name, options.launcher, options.steps, root, idle=True))
        for what in options.ablate:
            results.append(run_ablated(what, options.steps, root))
    rows = [[r["set"], common.fmt(r["present_ms"]), common.fmt(r["absent_ms"]), r["n_present"], r["n_absent"],
             common.fmt(r["ratio"]), common.fmt(r["ratio_of_means"])] for r in results]
    common.print_table(f"What a part costs a {hosted.WORKERS}-rank hosted_sft.py step, inside one run each "
                       f"({options.steps} steps; Ray start {ray_s:.1f} s)",
                       ["part", "present_ms", "absent_ms", "n_present", "n_absent", "present/absent",
                        "of means"], rows,
                       notes=["present / absent > 1: what the part costs the step; `none`'s distance from 1 is the "
                              "method's noise"])
    common.write_json(options.json, {"machine": common.machine_info(), "steps": options.steps, "window_s": WINDOW_S,
                                     "block": hosted_ablate.BLOCK, "results": results, "ray_start_s": ray_s})


if __name__ == "__main__":
    sys.exit(main())
