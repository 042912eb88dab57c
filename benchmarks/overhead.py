"""Per-step overhead of raytrainer against hand-written torch loops (and HF's Trainer), same model and data.

    python benchmarks/overhead.py                 # 300 steps, 2 rounds: ~4-5 min on a 2-core machine
    python benchmarks/overhead.py --quick         # 120 steps, 1 round: ~1.5 min
    python benchmarks/overhead.py --steps 600 --repeats 3 --variants dcebgfa --json /tmp/overhead.json

Variants (same MLP, same synthetic rows, same per-worker batch, AdamW (adamw_torch, not fused), linear
schedule, max_grad_norm, one torch thread per process, no checkpoints, a log every --log-every steps):
  a  raytrainer, num_workers=2 (Ray Train V2 worker group, DDP over gloo)
  b  hand-written DDP: torch.multiprocessing.spawn, 2 processes, gloo, contiguous sharding
  c  raytrainer, num_workers=0 (in the driver process)
  d  hand-written single-process loop
  e  Hugging Face transformers.Trainer, single process (use_cpu=True), if transformers is importable
  g  the hand-written loop of (b) inside a bare Ray Train V2 TorchTrainer (what Ray Train itself costs)
  f  (optional) as (a) with average_tokens_across_devices=False
Each round runs the variants in order; Ray is started only for (a), (f), (g), and stopped before any other.

Step time: every variant records time.perf_counter() at the start of each optimizer step on rank 0 (a
`training_step` override for raytrainer, shipped to the workers; a callback's on_step_begin for HF); the
steady state is the median of the step durations after the first --warmup fraction. Start-up: from the
call (`trainer.train()`, `mp.spawn`, the loop function, HF `Trainer(...)`) to the start of the first step;
for (a) Ray itself is started before, and timed separately. Ratios are computed, never asserted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import (  # noqa: E402
    MLP,
    ContiguousShardSampler,
    SyntheticDataset,
    linear_schedule,
    num_params,
    print_table,
    read_stamps,
    step_stats,
    write_stamps,
)

TARGET = 1.05


@dataclass
class Config:
    steps: int = 400
    batch: int = 64            # per worker (per process)
    dim: int = 384
    hidden: int = 768
    depth: int = 3
    num_classes: int = 16
    samples: int = 16384       # a multiple of 2*batch, so every batch is full in every variant
    lr: float = 1e-3
    max_grad_norm: float = 1.0
    log_every: int = 50
    seed: int = 42
    warmup: float = 0.2


def build_model(cfg: Config) -> MLP:
    torch.manual_seed(cfg.seed)  # raytrainer seeds before using the shipped model; same initial weights
    return MLP(cfg.dim, cfg.hidden, cfg.depth, cfg.num_classes)


def build_dataset(cfg: Config) -> SyntheticDataset:
    return SyntheticDataset(cfg.samples, cfg.dim, cfg.num_classes)


# ---------------------------------------------------------------------------------- hand-written loops
def hand_loop(cfg: Config, rank: int, world: int, stamp_path: str, entered: float = None):
    """The loop one would write by hand: DDP when world > 1, contiguous shards, AdamW + linear decay."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader
    from torch.utils.data._utils.collate import default_collate

    torch.set_num_threads(1)
    model = build_model(cfg)
    if world > 1:
        model = DistributedDataParallel(model)
    dataset = build_dataset(cfg)
    sampler = ContiguousShardSampler(len(dataset), cfg.batch, rank, world, cfg.seed)
    loader = DataLoader(dataset, batch_sampler=sampler, collate_fn=default_collate)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, linear_schedule(cfg.steps))
    perf, wall, steps = [], [], []
    loss_sum = torch.zeros((), dtype=torch.float64)
    interval = torch.zeros((), dtype=torch.float64)
    step, epoch = 0, 0
    while step < cfg.steps:
        sampler.set_epoch(epoch)
        for batch in loader:
            perf.append(time.perf_counter())
            wall.append(time.time())
            steps.append(step)
            model.train()
            loss = model(**batch)["loss"]
            loss.backward()
            if cfg.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            interval += loss.detach()
            step += 1
            if step % cfg.log_every == 0:  # what a hand-written loop logs: the mean loss over ranks
                if world > 1:
                    dist.all_reduce(interval)
                loss_sum += interval / world
                interval.zero_()
            if step >= cfg.steps:
                break
        epoch += 1
    if world > 1:
        dist.all_reduce(interval)
    loss_sum += interval / world
    if rank == 0:
        write_stamps(stamp_path, perf, wall, steps, train_loss=float(loss_sum) / cfg.steps,
                     threads=torch.get_num_threads(), entered=entered)


@contextlib.contextmanager
def gloo_group(rank: int, world: int, port: int):
    """A spawned process's gloo group on loopback, one torch thread, left by every rank together."""
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    yield
    # Leave together: a rank that tears gloo down while its peer still talks to it can abort the peer.
    dist.barrier()
    dist.destroy_process_group()


def _ddp_worker(rank: int, world: int, port: int, cfg: Config, stamp_path: str):
    entered = time.time()
    with gloo_group(rank, world, port):
        hand_loop(cfg, rank, world, stamp_path, entered)


def run_hand_ddp(cfg: Config, workdir: str) -> dict:
    import torch.multiprocessing as mp

    path = os.path.join(workdir, "hand-ddp.json")
    t0 = time.time()
    mp.spawn(_ddp_worker, args=(2, common.free_port(), cfg, path), nprocs=2, join=True)
    return _result(read_stamps(path), t0, time.time() - t0, cfg)


def run_hand_single(cfg: Config, workdir: str) -> dict:
    path = os.path.join(workdir, "hand-single.json")
    t0 = time.time()
    hand_loop(cfg, 0, 1, path, t0)
    return _result(read_stamps(path), t0, time.time() - t0, cfg)


# ------------------------------------------------------------------------------------------ raytrainer
def run_raytrainer(cfg: Config, workdir: str, num_workers: int, average_tokens: bool = True,
                   keep_group: bool = False) -> dict:
    import raytrainer

    timed = common.make_timed_trainer_class()
    stamp_dir = tempfile.mkdtemp(prefix=f"rt{num_workers}-", dir=workdir)
    args = raytrainer.TrainingArguments(
        output_dir=os.path.join(workdir, f"out-rt{num_workers}"), num_workers=num_workers, max_steps=cfg.steps,
        per_device_train_batch_size=cfg.batch, learning_rate=cfg.lr, weight_decay=0.0, optim="adamw_torch",
        lr_scheduler_type="linear", max_grad_norm=cfg.max_grad_norm, save_strategy="no",
        logging_steps=cfg.log_every, disable_tqdm=True, seed=cfg.seed,
        average_tokens_across_devices=average_tokens)
    trainer = timed(model=build_model(cfg), args=args, train_dataset=build_dataset(cfg))
    trainer.stamp_dir = stamp_dir
    trainer.pop_callback(raytrainer.PrinterCallback)  # keep the table readable (driver side only)
    t0 = time.time()
    output = trainer.train()
    total = time.time() - t0
    if not keep_group:
        trainer.close()  # its idle worker group would hold the CPUs a Ray variant run next in this Ray needs
    files = [f for f in os.listdir(stamp_dir) if f.startswith("rank0-")]
    stamps = read_stamps(os.path.join(stamp_dir, files[0]))
    stamps["train_loss"] = output.training_loss
    return _result(stamps, t0, total, cfg)


# ------------------------------------------------------------------------------------------------- HF
def run_hf(cfg: Config, workdir: str) -> dict:
    import transformers

    class Stamps(transformers.TrainerCallback):
        def __init__(self):
            self.perf, self.wall, self.steps = [], [], []

        def on_step_begin(self, args, state, control, **kwargs):
            self.perf.append(time.perf_counter())
            self.wall.append(time.time())
            self.steps.append(state.global_step)

    torch.set_num_threads(1)
    stamps = Stamps()
    t0 = time.time()
    args = transformers.TrainingArguments(
        output_dir=os.path.join(workdir, "out-hf"), use_cpu=True, report_to=[], save_strategy="no",
        max_steps=cfg.steps, per_device_train_batch_size=cfg.batch, learning_rate=cfg.lr, weight_decay=0.0,
        optim="adamw_torch", lr_scheduler_type="linear", max_grad_norm=cfg.max_grad_norm,
        logging_steps=cfg.log_every, disable_tqdm=True, seed=cfg.seed, dataloader_num_workers=0,
        log_level="error")
    trainer = transformers.Trainer(model=build_model(cfg), args=args, train_dataset=build_dataset(cfg),
                                   callbacks=[stamps])
    trainer.remove_callback(transformers.PrinterCallback)
    output = trainer.train()
    total = time.time() - t0
    return _result({"perf": stamps.perf, "wall": stamps.wall, "steps": stamps.steps,
                    "train_loss": output.training_loss, "threads": torch.get_num_threads()}, t0, total, cfg)


# ------------------------------------------------------------------------------ plain Ray Train (TorchTrainer)
def _ray_train_loop(config: dict, rank: int, world: int, device):
    # (Note for editors: a Config field named `classes` made Ray's cloudpickle try to pickle the
    # `torch.classes` submodule, since `cfg.classes` and `torch` appear in the same pickled function.)
    hand_loop(config["cfg"], rank, world, config["path"], entered=time.time())


def run_ray_train_plain(cfg: Config, workdir: str) -> dict:
    """The hand-written DDP loop inside a bare Ray Train V2 TorchTrainer: what Ray Train itself costs,
    so (a) / (g) is what raytrainer adds on top of Ray Train."""
    path = os.path.join(workdir, "ray-train-plain.json")
    t0 = time.time()
    common.run_in_bare_ray_train(_ray_train_loop, {"cfg": cfg, "path": path}, workdir, 2)
    return _result(read_stamps(path), t0, time.time() - t0, cfg)


# ---------------------------------------------------------------------------------------------- report
def _result(stamps: dict, t0_wall: float, total_s: float, cfg: Config) -> dict:
    stats = step_stats(stamps["perf"], cfg.warmup)
    entered = stamps.get("entered")
    return {**stats, "startup_s": stamps["wall"][0] - t0_wall,
            "to_worker_code_s": None if entered is None else entered - t0_wall,
            "worker_setup_s": None if entered is None else stamps["wall"][0] - entered,
            "total_s": total_s, "steps": len(stamps["perf"]), "train_loss": stamps.get("train_loss"),
            "threads": stamps.get("threads")}


VARIANTS = {  # letter: (name, processes, needs Ray)
    "a": ("raytrainer num_workers=2", 2, True),
    "b": ("hand-written DDP (mp.spawn)", 2, False),
    "c": ("raytrainer num_workers=0", 1, False),
    "d": ("hand-written single proc", 1, False),
    "e": ("HF transformers.Trainer", 1, False),
    "f": ("raytrainer nw=2 avg_tokens=False", 2, True),
    "g": ("hand loop in bare TorchTrainer", 2, True),
}
RATIOS = (("a", "b"), ("c", "d"), ("e", "d"), ("a", "g"), ("g", "b"), ("f", "b"))
TARGETS = {"a/b": TARGET, "c/d": TARGET, "e/d": TARGET, "a/g": 1.03}  # a/g: what raytrainer adds to Ray Train


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=None, help="optimizer steps per variant (default 300)")
    parser.add_argument("--quick", action="store_true", help="120 steps, one round, variants dceba (about 1.5 min)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="rounds of all variants (default 2, --quick 1); ratios are paired within a round")
    parser.add_argument("--variants", default=None,
                        help="letters from abcdefg, run in this order each round (default dcebga, --quick dceba). "
                             "f: as a with average_tokens_across_devices=False (no per-step item-count all-reduce); "
                             "g: the hand-written loop inside a bare Ray Train TorchTrainer")
    parser.add_argument("--batch", type=int, default=64, help="per-worker batch size")
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--depth", type=int, default=3)
    parser.add_argument("--log-every", type=int, default=50)
    parser.add_argument("--warmup", type=float, default=0.2, help="fraction of step durations dropped as warm-up")
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="1.0 in every variant, or 0 in every one")
    parser.add_argument("--json", default=None, help="write the results here as JSON")
    opts = parser.parse_args(argv)

    steps = opts.steps or (120 if opts.quick else 300)
    repeats = opts.repeats or (1 if opts.quick else 2)
    cfg = Config(steps=steps, batch=opts.batch, dim=opts.dim, hidden=opts.hidden, depth=opts.depth,
                 log_every=opts.log_every, warmup=opts.warmup, max_grad_norm=opts.max_grad_norm)
    cfg.samples = max(2 * cfg.batch, (cfg.samples // (2 * cfg.batch)) * 2 * cfg.batch)
    variants = [v for v in (opts.variants or ("dceba" if opts.quick else "dcebga")) if v in VARIANTS]
    if "e" in variants:
        try:
            import transformers  # noqa: F401
        except ImportError:
            print("transformers is not importable: skipping variant e")
            variants.remove("e")

    common.ship_by_value()
    common.quiet_ray_logs()
    torch.set_num_threads(1)  # the in-process variants (c, d, e) run in this process
    print(f"model: MLP dim={cfg.dim} hidden={cfg.hidden} depth={cfg.depth} "
          f"({num_params(build_model(cfg)) / 1e6:.2f}M params), batch {cfg.batch}/worker, {cfg.steps} steps, "
          f"{repeats} round(s), warm-up {cfg.warmup:.0%} dropped, max_grad_norm={cfg.max_grad_norm}, "
          "1 torch thread per process", flush=True)

    runners = {"a": lambda w: run_raytrainer(cfg, w, 2), "b": lambda w: run_hand_ddp(cfg, w),
               "c": lambda w: run_raytrainer(cfg, w, 0), "d": lambda w: run_hand_single(cfg, w),
               "e": lambda w: run_hf(cfg, w), "f": lambda w: run_raytrainer(cfg, w, 2, average_tokens=False),
               "g": lambda w: run_ray_train_plain(cfg, w)}
    # Warm this process up (first forward/backward, optimizer, DataLoader imports) so that the in-process
    # variants' start-up does not depend on which of them runs first.
    with tempfile.TemporaryDirectory() as tmp:
        hand_loop(Config(**{**asdict(cfg), "steps": 5}), 0, 1, os.path.join(tmp, "warm.json"))
    rounds = []
    for r in range(repeats):
        workdir = tempfile.mkdtemp(prefix="raytrainer-bench-overhead-")
        results, ray_init = {}, []
        try:
            for v in variants:
                if VARIANTS[v][2]:
                    import ray

                    if not ray.is_initialized():
                        ray_init.append(common.start_ray())
                else:
                    common.stop_ray()  # never run a baseline next to an idle Ray
                print(f"[round {r + 1}/{repeats}] ({v}) {VARIANTS[v][0]} ...", flush=True)
                results[v] = runners[v](workdir)
                results[v]["loadavg_1m_after"] = os.getloadavg()[0]
                print(f"    median {results[v]['median_ms']:.2f} ms/step, start-up {results[v]['startup_s']:.2f} s, "
                      f"load {results[v]['loadavg_1m_after']:.1f}", flush=True)
        finally:
            common.stop_ray()
            shutil.rmtree(workdir, ignore_errors=True)
        pairs = [(x, y) for x, y in RATIOS if x in results and y in results]
        rounds.append({"results": results, "ray_init_s": statistics.median(ray_init) if ray_init else None,
                       "ratios": {f"{x}/{y}": results[x]["median_ms"] / results[y]["median_ms"] for x, y in pairs},
                       "mean_ratios": {f"{x}/{y}": results[x]["mean_ms"] / results[y]["mean_ms"] for x, y in pairs}})

    report(cfg, variants, rounds, opts)


def _med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def report(cfg: Config, variants, rounds, opts):
    rows = []
    for v in variants:
        res = [rd["results"][v] for rd in rounds]
        rows.append([f"({v}) {VARIANTS[v][0]}", VARIANTS[v][1], _med([x["median_ms"] for x in res]),
                     f"{_med([x['p25_ms'] for x in res]):.2f}-{_med([x['p75_ms'] for x in res]):.2f}",
                     _med([x["mean_ms"] for x in res]), _med([x["startup_s"] for x in res]),
                     _med([x["to_worker_code_s"] for x in res]), _med([x["worker_setup_s"] for x in res]),
                     _med([x["total_s"] for x in res]), _med([x["train_loss"] for x in res]),
                     " ".join(f"{x['loadavg_1m_after']:.1f}" for x in res)])
    ray_init = _med([rd["ray_init_s"] for rd in rounds])
    many = f", median over {len(rounds)} rounds" if len(rounds) > 1 else ""
    print_table(f"Steady-state step time and start-up ({cfg.steps} steps; step durations after the first "
                f"{cfg.warmup:.0%}{many})",
                ["variant", "procs", "ms/step med", "p25-p75 ms", "ms/step mean", "start-up s",
                 "..to worker code", "..worker set-up", "total s", "train loss", "load after"], rows,
                notes=["start-up = call -> start of the first step = to worker code (call -> the trainer is unpickled "
                       "in the worker / the spawned function runs) + worker set-up (-> first step)",
                       f"Ray itself (ray.init before the Ray variants, not in their start-up): {ray_init:.2f} s"
                       if ray_init is not None else "Ray was not started",
                       "equal train loss in (a),(b),(g) and in (c),(d): same initial weights, same batches, same "
                       "updates",
                       "load after: 1-minute load average after each round's run (2 cores; > ~2.5 means the run shared "
                       "the CPUs with something else)"])
    ratio_rows, summary = [], {}
    for x, y in RATIOS:
        key = f"{x}/{y}"
        per_round = [rd["ratios"][key] for rd in rounds if key in rd["ratios"]]
        if not per_round:
            continue
        med = statistics.median(per_round)
        mean_ratio = statistics.median([rd["mean_ratios"][key] for rd in rounds if key in rd["mean_ratios"]])
        best = min(rd["results"][x]["median_ms"] for rd in rounds) / min(rd["results"][y]["median_ms"] for rd in rounds)
        pooled = (statistics.median(rd["results"][x]["median_ms"] for rd in rounds)
                  / statistics.median(rd["results"][y]["median_ms"] for rd in rounds))
        target = TARGETS.get(key)
        summary[key] = {"median": med, "mean_based": mean_ratio, "best_of_rounds": best, "of_medians": pooled,
                        "per_round": per_round}
        ratio_rows.append([f"({x}) / ({y})", med, mean_ratio, best, pooled, f"<= {target}" if target else "info",
                           ("yes" if med <= target else "NO") if target else "-",
                           " ".join(f"{p:.3f}" for p in per_round)])
    print_table("Ratios of steady-state step time (reported, not asserted)",
                ["ratio", "median", "mean-based", "best/best", "of medians", "target", "met", "per round"],
                ratio_rows,
                notes=["median: of per-round ratios of median step times (the headline); mean-based includes periodic "
                       "work (logging, event flushes); best/best: fastest round of each side (least disturbed); of "
                       "medians: each side's median over the rounds, divided (a worker group's speed on 2 shared cores "
                       "can differ by 30% from one start to the next: pairing rounds then adds that spread)",
                       "(a)/(g): what raytrainer adds on top of Ray Train; (g)/(b): what Ray Train's worker group "
                       "costs"])
    common.write_json(opts.json, {"benchmark": "overhead", "config": asdict(cfg),
                                  "variants": {v: VARIANTS[v][0] for v in variants}, "rounds": rounds,
                                  "summary": {"ratios": summary, "target": TARGET}, "machine": common.machine_info()})


if __name__ == "__main__":
    main()
