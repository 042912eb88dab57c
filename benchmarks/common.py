"""Shared pieces of the benchmarks: the model, the synthetic data, per-step timing, Ray set-up, tables.

Everything here is importable by the Ray workers too: `common` is shipped by value with cloudpickle
(`ship_by_value()`), so a worker does not need `benchmarks/` on its path.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import statistics
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---------------------------------------------------------------------------------------------- model
class MLP(nn.Module):
    """A plain-torch classifier with a HF-style forward: `forward(x, labels=None) -> {"loss", "logits"}`."""

    def __init__(self, dim: int = 512, hidden: int = 1024, depth: int = 3, num_classes: int = 16):
        super().__init__()
        layers: List[nn.Module] = [nn.Linear(dim, hidden), nn.GELU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(hidden, hidden), nn.GELU()]
        layers.append(nn.Linear(hidden, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x, labels=None):
        logits = self.net(x)
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


def num_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------------------------- data
class SyntheticDataset(torch.utils.data.Dataset):
    """`{"x": float[dim], "labels": int}` rows, labelled by a fixed random linear teacher.

    Pickles as its parameters only and regenerates the tensors on unpickling, so shipping it to a Ray
    worker costs nothing (the same rows come out: the generator is seeded)."""

    def __init__(self, size: int, dim: int, num_classes: int, seed: int = 1234):
        self.params = (size, dim, num_classes, seed)
        self._build()

    def _build(self):
        size, dim, num_classes, seed = self.params
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(size, dim, generator=g)
        teacher = torch.randn(dim, num_classes, generator=g)
        self.y = (self.x @ teacher + 0.5 * torch.randn(size, num_classes, generator=g)).argmax(-1)

    def __getstate__(self):
        return {"params": self.params}

    def __setstate__(self, state):
        self.params = state["params"]
        self._build()

    def __len__(self):
        return self.params[0]

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def epoch_order(num_samples: int, seed: int, epoch: int) -> List[int]:
    """The sample order of one epoch: the same recipe raytrainer's sampler documents (seed + epoch)."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    return torch.randperm(num_samples, generator=g).tolist()


class ContiguousShardSampler(torch.utils.data.Sampler):
    """DistributedSampler-like batch sampler: each global batch of batch*world consecutive samples of the
    epoch's order, rank r takes its contiguous slice (a hand-written loop's usual choice)."""

    def __init__(self, num_samples: int, batch_size: int, rank: int, world_size: int, seed: int):
        self.n, self.b, self.rank, self.world = num_samples, batch_size, rank, world_size
        self.seed, self.epoch = seed, 0

    def set_epoch(self, epoch: int):
        self.epoch = epoch

    def __len__(self):
        return self.n // (self.b * self.world)

    def __iter__(self):
        order = epoch_order(self.n, self.seed, self.epoch)
        g = self.b * self.world
        for start in range(0, len(self) * g, g):
            lo = start + self.rank * self.b
            yield order[lo:lo + self.b]


def linear_schedule(total_steps: int):
    """HF's linear decay without warm-up, as a picklable LambdaLR factor."""
    return lambda step: max(0.0, (total_steps - step) / max(1, total_steps))


# -------------------------------------------------------------------------------------- step timing
def write_stamps(path: str, perf: List[float], wall: List[float], steps: List[int], **extra):
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"perf": perf, "wall": wall, "steps": steps, "pid": os.getpid(), **extra}, f)
    os.replace(tmp, path)


def read_stamps(path: str) -> dict:
    with open(path) as f:
        return json.load(f)


def machine_busy_s() -> float:
    """CPU seconds this machine's cores have spent busy since boot (/proc/stat; 0.0 where there is none)."""
    try:
        with open("/proc/stat") as f:
            fields = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def script_phases(stamps: dict, called: float) -> dict:
    """A timed script's phases from its stamps (make_step_stamps_callback) and the time it was launched: launch ->
    script start, script start -> train begin, train begin -> first step end, and the median step after the first
    fifth of the steps."""
    steps = stamps["steps"]
    gaps = [b - a for a, b in zip(steps, steps[1:])]
    return {"to_script_s": stamps["started"] - called, "script_s": stamps["train_begin"] - stamps["started"],
            "first_step_s": steps[0] - stamps["train_begin"],
            "steady_step_ms": 1000 * statistics.median(gaps[len(gaps) // 5:]), "steps": len(steps)}


def step_stats(perf: Sequence[float], warmup_frac: float = 0.2) -> Dict[str, float]:
    """Steady-state step time from start-of-step timestamps: durations after dropping the first
    `warmup_frac` of them. Median is the headline (robust to the periodic log / event flush); the
    mean shows what periodic work costs on average."""
    durations = [b - a for a, b in zip(perf, perf[1:])]
    skip = int(len(durations) * warmup_frac)
    steady = durations[skip:] or durations
    q = statistics.quantiles(steady, n=4) if len(steady) >= 2 else [steady[0]] * 3
    return {"median_ms": 1e3 * statistics.median(steady), "mean_ms": 1e3 * statistics.fmean(steady),
            "p25_ms": 1e3 * q[0], "p75_ms": 1e3 * q[2], "n": len(steady)}


def make_timed_trainer_class():
    """A `raytrainer.Trainer` subclass that records, on rank 0, the start time of every training_step
    (one per optimizer step with gradient_accumulation_steps=1) and writes them to
    `{stamp_dir}/rank0-{pid}.json` at the last step. It runs in each worker (the subclass is shipped).

    Hooks for the other benchmarks: `threads` (torch.set_num_threads in the worker), `kill` (a dict
    {"rank", "step", "marker", "wait_for"}: that rank exits with os._exit(1) once, at that step)."""
    import raytrainer

    class TimedTrainer(raytrainer.Trainer):
        stamp_dir: Optional[str] = None
        threads: int = 1
        kill: Optional[dict] = None

        def __setstate__(self, state):
            super().__setstate__(state)
            self._b_unpickled = time.time()  # the worker (or in-process copy) has the trainer: its code runs now

        def _bench_init(self):
            torch.set_num_threads(self.threads)
            self._b_perf, self._b_wall, self._b_steps = [], [], []
            self._b_path = os.path.join(self.stamp_dir, f"rank{self.ctx.rank}-{os.getpid()}.json")
            # A restarted worker group sees the marker already there at its first step.
            self._b_restarted = bool(self.kill) and os.path.exists(self.kill["marker"])

        def _bench_dump(self):
            write_stamps(self._b_path, self._b_perf, self._b_wall, self._b_steps, rank=self.ctx.rank,
                         restarted=self._b_restarted, threads=torch.get_num_threads(),
                         entered=getattr(self, "_b_unpickled", None))

        def training_step(self, model, inputs, num_items_in_batch=None):
            if getattr(self, "_b_perf", None) is None:
                self._bench_init()
            step = self.state.global_step  # the step about to run (incremented after the optimizer step)
            if self.kill and self.ctx.rank == self.kill["rank"] and step == self.kill["step"] \
                    and not os.path.exists(self.kill["marker"]):
                self._bench_die()
            if self.ctx.rank == 0:
                self._b_perf.append(time.perf_counter())
                self._b_wall.append(time.time())
                self._b_steps.append(step)
                if self.kill and len(self._b_perf) == 1:
                    self._bench_dump()  # the first step of each attempt, on disk at once
            loss = super().training_step(model, inputs, num_items_in_batch=num_items_in_batch)
            if self.ctx.rank == 0 and step == self.state.max_steps - 1:
                self._bench_dump()
            return loss

        def _bench_die(self):
            deadline = time.time() + 120
            wait_for = self.kill.get("wait_for")
            while wait_for and not os.path.exists(wait_for) and time.time() < deadline:
                time.sleep(0.05)  # the checkpoint we expect to resume from must be committed first
            with open(self.kill["marker"], "w") as f:
                json.dump({"time": time.time(), "step": self.state.global_step, "pid": os.getpid()}, f)
            os._exit(1)

    return TimedTrainer


def timed_script_parser():
    """The arguments every timed script takes from the benchmark that runs it (hosted.py, gpu.py): where HF writes,
    how many steps, and where rank 0 writes its stamps (`make_step_stamps_callback`). A script adds its own."""
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=100)
    parser.add_argument("--stamps", default="")
    return parser


def make_step_stamps_callback(path: str, started: float, extra: Optional[Callable[[], dict]] = None):
    """A `transformers.TrainerCallback` for a timed script (hosted_sft.py, gpu_hosted_script.py): rank 0
    writes the script's start (`started`, taken before its imports), train begin and every step end to `path`,
    with what `extra()` returns at train end. Built on call, so that importing this module needs no
    transformers."""
    from transformers import TrainerCallback

    class Stamps(TrainerCallback):
        def __init__(self):
            self.begin, self.steps = None, []

        def on_train_begin(self, args, state, control, **kwargs):
            self.begin = time.time()

        def on_step_end(self, args, state, control, **kwargs):
            self.steps.append(time.time())

        def on_train_end(self, args, state, control, **kwargs):
            if path and state.is_world_process_zero:
                with open(path, "w") as f:
                    json.dump({"started": started, "train_begin": self.begin, "steps": self.steps,
                               **(extra() if extra else {})}, f)

    return Stamps()


# ------------------------------------------------------------------------------------------------ Ray
def free_port() -> int:
    """A TCP port free on this machine now (for a process group's MASTER_PORT)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(nproc: int) -> list:
    """`torchrun --nproc_per_node nproc` on a free port: torchrun's default 29500 may still be held by the
    socket of the run before (a benchmark's second round then failed to start)."""
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_port", str(free_port())]


def ship_by_value():
    """Make cloudpickle send this module's classes by value, so the workers need not import it."""
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def start_ray(num_cpus: Optional[int] = None, root: str = REPO_ROOT, dashboard: bool = False,
              address: Optional[str] = None) -> float:
    """A fresh embedded Ray, as raytrainer's `cluster.connect()` starts one, but never another session's
    cluster: with address=None, ray.init joins whatever /tmp/ray/ray_current_cluster names (a `ray start`
    by someone else). raytrainer reuses an initialised Ray as it is. `root`: where the workers import
    raytrainer from (another checkout, to measure its code). `dashboard`: for `ray.util.state`. `address`: a
    running Ray to join instead, named on purpose (the test suite's, for a smoke run whose figures mean
    nothing). Returns the seconds it took."""
    import ray

    t0 = time.perf_counter()
    os.environ["RAY_TRAIN_V2_ENABLED"] = "1"
    here = os.path.dirname(os.path.abspath(__file__))
    existing = os.environ.get("PYTHONPATH", "")
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([here, root] + ([existing] if existing else [])))
    env_vars = {"RAY_TRAIN_V2_ENABLED": "1"}
    if address:
        ray.init(address=address, logging_level=logging.WARNING, runtime_env={"env_vars": env_vars})
    else:  # with the changes of Ray's defaults that raytrainer's embedded Ray makes (idle workers, no metrics)
        from raytrainer.coordinator.cluster import embedded_system_config

        ray.init(address="local", num_cpus=num_cpus, logging_level=logging.WARNING, include_dashboard=dashboard,
                 runtime_env={"env_vars": env_vars}, _system_config=embedded_system_config())
    return time.perf_counter() - t0


def run_in_bare_ray_train(loop, config: dict, workdir: str, num_workers: int, use_gpu: bool = False) -> None:
    """`loop(config, rank, world_size, device)` on every worker of a bare Ray Train V2 `TorchTrainer` (gloo on
    CPU, NCCL on GPU), no raytrainer: the baseline that shows what raytrainer adds on top of Ray Train."""
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    def train_fn(cfg: dict):
        import ray.train
        import ray.train.torch

        ctx = ray.train.get_context()
        loop(cfg, ctx.get_world_rank(), ctx.get_world_size(), ray.train.torch.get_device())

    TorchTrainer(train_fn, train_loop_config=config,
                 scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu),
                 run_config=RunConfig(name=f"bench-plain-{os.getpid()}-{int(time.time())}", storage_path=workdir,
                                      failure_config=FailureConfig(max_failures=0)),
                 torch_config=TorchConfig(backend="nccl" if use_gpu else "gloo")).fit()


def stop_ray():
    import ray

    if ray.is_initialized():
        ray.shutdown()


def quiet_ray_logs():
    for name in ("ray", "ray.train", "ray.tune", "ray.data"):
        logging.getLogger(name).setLevel(logging.ERROR)
    os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_TRACKING", "0")


# --------------------------------------------------------------------------------------------- output
def fmt(value, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def print_table(title: str, headers: List[str], rows: List[List], notes: Sequence[str] = ()):
    cells = [[fmt(c) for c in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = "+".join("-" * (w + 2) for w in widths)
    print(f"\n{title}")
    print(" | ".join(h.ljust(w) for h, w in zip(headers, widths)))
    print(line.replace("+", "|"))
    for row in cells:
        print(" | ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))))
    for note in notes:
        print(f"  {note}")
    sys.stdout.flush()


class BackgroundThread:
    """A `with` block during which `self._run()` works in a daemon thread; `self._done` is set when the block
    ends (the thread's loop waits on it), and the block's end joins the thread."""

    def __init__(self, name: str):
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self):
        raise NotImplementedError

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._done.set()
        self._thread.join()


def machine_info() -> dict:
    import platform

    info = {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
            "platform": platform.platform()}
    try:
        info["loadavg_at_start"] = os.getloadavg()
    except OSError:
        pass
    for name in ("ray", "transformers", "fsspec", "s3fs"):
        try:
            info[name] = __import__(name).__version__
        except Exception:
            pass
    return info


def write_json(path: Optional[str], payload: dict):
    if not path:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=2, default=str)
    print(f"\nwrote {path}")
