"""Where the test suite's CPU goes, by kind of process: run the suite (or any command) and sample every process's
CPU time from /proc, then sum it by what the process is (pytest's processes, Ray's own daemons, worker group
actors, Ray Data tasks, subprocess drivers and scripts, torchrun's processes, moto, ...).

    python benchmarks/suite_budget.py                          # runs `python -m pytest -p no:cacheprovider -q`
    python benchmarks/suite_budget.py --json /tmp/budget.json -- python -m pytest tests/worker -q

On a 2-core machine the suite is CPU-bound (load 5 and more), so its wall time follows the CPU seconds spent, and
this table says which kind of work to cut. A process's time is its own (utime + stime, read at its last sample, so
a process that lives less than one interval is missed: --interval 0.5 by default); only the command's descendants
count, found parent first. Linux only.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

TICKS = os.sysconf("SC_CLK_TCK")

# (kind, a test on the process's command line): the first that matches names it.
KINDS = (
    ("worker group: Ray Train workers", lambda c: c.startswith("ray::RayTrainWorker")),
    ("worker group: controller and event sink", lambda c: c.startswith(("ray::TrainController", "ray::EventSink",
                                                                        "ray::RunLink"))),
    ("Ray Data: tasks and split coordinators", lambda c: c.startswith(("ray::Map", "ray::ReadRange",
                                                                      "ray::SplitCoordinator", "ray::_MapWorker",
                                                                      "ray::Read", "ray::MapBatches",
                                                                      "ray::StatsActor", "ray::AutoscalingRequester"))),
    ("Ray: other actors and idle workers", lambda c: c.startswith("ray::") or "default_worker.py" in c),
    ("Ray: daemons (gcs, raylet, dashboard, agents, monitors)", lambda c: any(
        name in c for name in ("gcs_server", "raylet", "dashboard", "log_monitor", "monitor.py", "runtime_env",
                               "ray/_private", "ray-dashboard", "plasma", "ray start"))),
    ("torchrun and its processes", lambda c: "torch.distributed.run" in c or "torchrun" in c or "--nproc" in c),
    ("moto (S3 on loopback)", lambda c: "moto" in c),
    # (a driver's own command line may name a /tmp/pytest-of-... folder: the program decides, not the arguments)
    ("pytest (the test processes)", lambda c: "-m pytest" in c or "bin/pytest" in c or "exec(eval(sys.stdin" in c),
    ("ruff", lambda c: "ruff" in c),
    ("subprocess drivers and scripts", lambda c: "python" in c),
)


def command_line(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def cpu_seconds(pid: str) -> float:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime (fields 14 and 15 of stat)
    except (OSError, IndexError, ValueError):
        return -1.0


def parent_of(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[1]
    except (OSError, IndexError):
        return ""


def kind_of(command: str) -> str:
    return next((kind for kind, test in KINDS if test(command)), "other")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--interval", type=float, default=0.5)
    parser.add_argument("--json")
    parser.add_argument("command", nargs="*", default=[sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                                                        "-q"])
    opts = parser.parse_args()
    command = opts.command[1:] if opts.command[:1] == ["--"] else opts.command
    seen: dict = {}  # pid -> (kind, command, latest cpu seconds)
    started = time.time()
    proc = subprocess.Popen(command)
    ours = {str(proc.pid)}  # the command and its descendants, found parent first
    while proc.poll() is None:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            cpu = cpu_seconds(pid)
            if cpu < 0:
                continue
            if pid not in ours:
                if parent_of(pid) not in ours:
                    continue  # another job's process on this machine (or one re-parented before it was seen)
                ours.add(pid)
            # Read each time: a Ray worker starts as default_worker.py and renames itself ray::<its actor> later.
            line = command_line(pid)
            if line:
                seen[pid] = [kind_of(line), line[:160], max(cpu, seen.get(pid, [0, 0, 0.0])[2])]
        time.sleep(opts.interval)
    wall = time.time() - started
    by_kind = collections.defaultdict(lambda: [0.0, 0])
    for kind, _, cpu in seen.values():
        by_kind[kind][0] += cpu
        by_kind[kind][1] += 1
    by_name = collections.defaultdict(lambda: [0.0, 0])  # within a kind: Ray's processes by actor or task name
    for kind, line, cpu in seen.values():
        name = line.split()[0] if line.startswith("ray::") else os.path.basename(line.split()[0])
        by_name[f"{kind}: {name}"][0] += cpu
        by_name[f"{kind}: {name}"][1] += 1
    total = sum(cpu for cpu, _ in by_kind.values())
    print(f"\nwall {wall:.0f} s, CPU {total:.0f} s over {len(seen)} processes ({total / wall:.2f} cores busy)")
    print(f"{'kind':58} {'CPU s':>8} {'share':>6} {'procs':>6}")
    for kind, (cpu, count) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        print(f"{kind:58} {cpu:8.0f} {cpu / max(total, 1e-9):6.1%} {count:6}")
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"wall_s": wall, "cpu_s": total, "rc": proc.returncode,
                       "by_kind": {k: {"cpu_s": v[0], "processes": v[1]} for k, v in by_kind.items()},
                       "by_name": {k: {"cpu_s": v[0], "processes": v[1]}
                                   for k, v in sorted(by_name.items(), key=lambda kv: -kv[1][0])},
                       "processes": sorted(seen.values(), key=lambda p: -p[2])[:200]}, f, indent=1)
    sys.exit(proc.returncode)


if __name__ == "__main__":
    main()
