"""A model too big to ship by pickle: raytrainer against bare Ray Train, call to first step and driver memory.

    python benchmarks/large_model.py                  # 201M-parameter MLP (800 MB fp32), 2 workers, 3 rounds
    python benchmarks/large_model.py --quick          # 17M parameters, 1 round
    python benchmarks/large_model.py --before /tmp/main-checkout   # adds (a0): variant (a) run on that code

Variants, each in a fresh driver process (so its peak RSS is its own), each starting its own embedded
local Ray (timed apart), the same MLP built on the driver with the same seed, the same synthetic rows, SGD
(no optimizer state, to keep 2 workers of an 800 MB model in memory), one torch thread per worker:
  a   raytrainer: Trainer(model=...).train(), num_workers=2 (DDP over gloo)
  b   bare Ray Train V2: ray.put(model.state_dict()), TorchTrainer whose worker builds the model, loads the
      state dict from the object store and calls ray.train.torch.prepare_model; the hand-written loop
  a0  (with --before PATH) variant (a) on the raytrainer found at PATH (e.g. a checkout of main)

Measured in each (after `import ray.train.torch, raytrainer`, as a script's imports): seconds from the call
(`trainer.train()`; `ray.put` + `TorchTrainer(...).fit()` for (b)) to the start of the first training step on
rank 0, split at the moment the worker's code starts (the trainer unpickled / the loop function entered); and
the driver process's peak RSS (`ru_maxrss`, which counts the shared-memory pages the driver touched in the
object store) over its whole life, with the RSS just before the call. (b) does not bring the trained weights
back to the driver (a bare Ray Train loop would save a checkpoint instead); (a) does, inside `train()`, so its
memory includes reading them. Ratios (a)/(b) are reported from the per-variant medians over the rounds; nothing
is asserted. Targets: call-to-first-step <= 1.2x bare, driver peak memory <= 1.3x bare.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import MLP, ContiguousShardSampler, SyntheticDataset, num_params, print_table, read_stamps, write_stamps  # noqa: E402

TARGET_START, TARGET_MEMORY = 1.2, 1.3


@dataclass
class Config:
    dim: int = 4096
    hidden: int = 4096
    depth: int = 12            # 12 x (4096 x 4096 + 4096) + 4096 x 16 + 16 = 201.4M parameters
    num_classes: int = 16
    steps: int = 3
    batch: int = 8             # per worker
    samples: int = 256
    lr: float = 1e-3
    seed: int = 42


def build_model(cfg: Config) -> MLP:
    torch.manual_seed(cfg.seed)
    return MLP(cfg.dim, cfg.hidden, cfg.depth, cfg.num_classes)


def build_dataset(cfg: Config) -> SyntheticDataset:
    return SyntheticDataset(cfg.samples, cfg.dim, cfg.num_classes)


def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# -------------------------------------------------------------------------------------------- (a) raytrainer
def run_raytrainer(cfg: Config, workdir: str) -> dict:
    import raytrainer

    timed = common.make_timed_trainer_class()
    stamp_dir = tempfile.mkdtemp(prefix="rt-", dir=workdir)
    args = raytrainer.TrainingArguments(
        output_dir=os.path.join(workdir, "out-rt"), num_workers=2, max_steps=cfg.steps,
        per_device_train_batch_size=cfg.batch, learning_rate=cfg.lr, weight_decay=0.0, optim="sgd",
        lr_scheduler_type="constant", max_grad_norm=0.0, save_strategy="no", logging_steps=cfg.steps,
        disable_tqdm=True, seed=cfg.seed)
    trainer = timed(model=build_model(cfg), args=args, train_dataset=build_dataset(cfg))
    trainer.stamp_dir = stamp_dir
    trainer.pop_callback(raytrainer.PrinterCallback)
    rss_before = rss_mb()
    t0 = time.time()
    trainer.train()
    total = time.time() - t0
    stamps = read_stamps(next(os.path.join(stamp_dir, f) for f in os.listdir(stamp_dir) if f.startswith("rank0")))
    first = trainer.model.net[0].weight.detach()[0, :4].tolist()  # the driver holds the trained weights
    return {"t0": t0, "entered": stamps["entered"], "first_step": stamps["wall"][0], "total_s": total,
            "rss_before_mb": rss_before, "check": first, "startup": getattr(trainer.state, "startup", None)}


# ------------------------------------------------------------------------------------------ (b) bare Ray Train
def _bare_train_fn(config: dict):
    import ray
    import ray.train
    import ray.train.torch
    from torch.utils.data import DataLoader
    from torch.utils.data._utils.collate import default_collate

    entered = time.time()
    torch.set_num_threads(1)
    cfg: Config = config["cfg"]
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    model = MLP(cfg.dim, cfg.hidden, cfg.depth, cfg.num_classes)
    model.load_state_dict(ray.get(config["state_ref"]))
    model = ray.train.torch.prepare_model(model)
    dataset = build_dataset(cfg)
    loader = DataLoader(dataset, batch_sampler=ContiguousShardSampler(len(dataset), cfg.batch, rank, world, cfg.seed),
                        collate_fn=default_collate)
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr)
    wall, perf, steps = [], [], []
    step = 0
    while step < cfg.steps:
        for batch in loader:
            wall.append(time.time())
            perf.append(time.perf_counter())
            steps.append(step)
            model(**batch)["loss"].backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            if step >= cfg.steps:
                break
    if rank == 0:
        write_stamps(config["path"], perf, wall, steps, entered=entered)


def run_bare(cfg: Config, workdir: str) -> dict:
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    model = build_model(cfg)
    path = os.path.join(workdir, "bare.json")
    rss_before = rss_mb()
    t0 = time.time()
    state_ref = ray.put(model.state_dict())
    TorchTrainer(_bare_train_fn, train_loop_config={"cfg": cfg, "path": path, "state_ref": state_ref},
                 scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                 run_config=RunConfig(name=f"bare-{os.getpid()}", storage_path=os.path.join(workdir, "ray")),
                 torch_config=TorchConfig(backend="gloo")).fit()
    total = time.time() - t0
    stamps = read_stamps(path)
    return {"t0": t0, "entered": stamps["entered"], "first_step": stamps["wall"][0], "total_s": total,
            "rss_before_mb": rss_before}


# ------------------------------------------------------------------------------------------- one variant
def child(variant: str, cfg: Config, root: str) -> dict:
    """Runs in its own process: start Ray, run one variant, report its figures as one JSON line."""
    sys.path.insert(0, root)  # the raytrainer under test (this checkout, or --before's)
    common.quiet_ray_logs()
    common.ship_by_value()
    ray_s = common.start_ray(num_cpus=4, root=root)
    # Imported before the clock starts in every variant, as a script's imports would be (raytrainer imports
    # Ray Train lazily, on the first train()).
    import ray.train.torch  # noqa: F401

    import raytrainer  # noqa: F401
    with tempfile.TemporaryDirectory(prefix=f"large-{variant}-") as workdir:
        out = (run_bare if variant == "b" else run_raytrainer)(cfg, workdir)
    common.stop_ray()
    out.update(variant=variant, ray_start_s=ray_s, peak_rss_mb=peak_rss_mb(), raytrainer=raytrainer.__file__,
               to_worker_s=out["entered"] - out["t0"], call_to_first_step_s=out["first_step"] - out["t0"],
               loadavg=os.getloadavg()[0])
    return out


def run_child(variant: str, cfg: Config, root: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", variant, "--config", json.dumps(asdict(cfg)),
           "--root", root]
    # The workers must import raytrainer from `root` only: Ray adds the driver's working directory and
    # PYTHONPATH to theirs, so both point there.
    env = {**os.environ, "PYTHONPATH": root}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
        raise RuntimeError(f"variant {variant} failed (exit {proc.returncode})")
    return json.loads(lines[-1][len("RESULT "):])


# -------------------------------------------------------------------------------------------------- main
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="17M parameters, 1 round")
    parser.add_argument("--repeats", type=int, default=None, help="rounds (default 3, 1 with --quick)")
    parser.add_argument("--hidden", type=int, default=None, help="MLP width (dim = hidden)")
    parser.add_argument("--depth", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--before", default=None, help="a raytrainer checkout to run as (a0), e.g. main")
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--config", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--root", default=common.REPO_ROOT, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)

    if opts.child:
        result = child(opts.child, Config(**json.loads(opts.config)), opts.root)
        print("RESULT " + json.dumps(result), flush=True)
        return

    cfg = Config(hidden=2048, dim=2048, depth=4) if opts.quick else Config()
    if opts.hidden:
        cfg.hidden = cfg.dim = opts.hidden
    if opts.depth:
        cfg.depth = opts.depth
    if opts.steps:
        cfg.steps = opts.steps
    repeats = opts.repeats or (1 if opts.quick else 3)
    params = num_params(MLP(cfg.dim, cfg.hidden, cfg.depth, cfg.num_classes).to("meta"))
    print(f"MLP {params / 1e6:.1f}M parameters ({params * 4 / 2**20:.0f} MiB fp32), 2 workers, {cfg.steps} steps, "
          f"{repeats} round(s); load average at start {os.getloadavg()[0]:.2f}", flush=True)
    variants = [("a", common.REPO_ROOT), ("b", common.REPO_ROOT)]
    if opts.before:
        variants.append(("a0", os.path.abspath(opts.before)))
    runs = []
    for r in range(repeats):
        for name, root in variants:
            out = run_child(name, cfg, root)
            out["round"], out["name"] = r, name
            runs.append(out)
            print(f"  round {r} {name}: call->first step {out['call_to_first_step_s']:.1f} s "
                  f"(to worker code {out['to_worker_s']:.1f} s), driver peak RSS {out['peak_rss_mb']:.0f} MiB "
                  f"(before the call {out['rss_before_mb']:.0f}), load {out['loadavg']:.2f}", flush=True)
            if out.get("startup"):  # raytrainer's own start-up timeline (raytrainer/startup.py)
                timeline = out["startup"]
                print(f"    start-up {timeline['total_s']:.1f} s ({timeline['group']} group): "
                      + ", ".join(f"{k} {v:.1f}" for k, v in ordered(timeline["phases_s"])), flush=True)
    report(cfg, params, variants, runs)
    common.write_json(opts.json, {"config": asdict(cfg), "params": params, "machine": common.machine_info(),
                                  "runs": runs})


PHASES = ("preflight", "pack", "group", "object store", "sink start", "group start", "unpack", "build", "wrap",
          "data", "optimizer", "resume", "first step")  # raytrainer/startup.py's order


def ordered(phases: dict) -> list:
    return sorted(phases.items(), key=lambda kv: PHASES.index(kv[0]) if kv[0] in PHASES else len(PHASES))


def report(cfg: Config, params: int, variants, runs):
    med = {name: {key: statistics.median(r[key] for r in runs if r["name"] == name)
                  for key in ("call_to_first_step_s", "to_worker_s", "peak_rss_mb", "rss_before_mb", "total_s")}
           for name, _ in variants}
    labels = {"a": "raytrainer train()", "b": "bare Ray Train + ray.put + prepare_model",
              "a0": "raytrainer train(), --before code"}
    rows = []
    for name, _ in variants:
        m = med[name]
        rows.append([f"({name}) {labels[name]}", m["call_to_first_step_s"], m["to_worker_s"],
                     m["call_to_first_step_s"] / med["b"]["call_to_first_step_s"], m["peak_rss_mb"],
                     m["peak_rss_mb"] - m["rss_before_mb"], m["peak_rss_mb"] / med["b"]["peak_rss_mb"], m["total_s"]])
    print_table(f"Large model: {params / 1e6:.1f}M-parameter MLP, 2 workers (medians over rounds)",
                ["variant", "call->step1 s", "->worker s", "x bare", "peak RSS MiB", "added MiB", "x bare",
                 "call total s"], rows,
                notes=[f"targets: call->first step <= {TARGET_START}x bare, driver peak RSS <= {TARGET_MEMORY}x bare",
                       "peak RSS: ru_maxrss of the driver process (includes object-store pages it touched); "
                       "added: peak minus RSS just before the call",
                       f"load average after the runs: {os.getloadavg()[0]:.2f}"])


if __name__ == "__main__":
    main()
