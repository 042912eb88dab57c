"""raytrainer's FSDP against a hand-written FSDP2 loop, same GPT-style model and data, in one run.

    python benchmarks/fsdp.py                          # CPU, gloo, a small GPT, 2 processes (~3-4 min on 2 cores)
    python benchmarks/fsdp.py --device cuda --gpus 8   # GPU, NCCL, a ~125M GPT-2-small in bf16 (untested here)
    python benchmarks/fsdp.py --steps 200 --repeats 2 --json /tmp/fsdp.json
    python benchmarks/fsdp.py --variants ga --steps 200 --repeats 3   # ours against the same loop in Ray Train

Variants (same model, same synthetic token rows, same per-process batch, AdamW (adamw_torch), constant LR,
max_grad_norm=1.0, FSDP2 `fully_shard` per block then the root, bf16 MixedPrecisionPolicy on GPU):
  a  raytrainer, strategy="fsdp", num_workers=N (Ray Train V2 worker group)
  b  hand-written FSDP2 loop: torch.multiprocessing.spawn, N processes, gloo (CPU) or NCCL (GPU)
  g  the loop of (b) inside a bare Ray Train V2 TorchTrainer (what Ray Train's worker group costs; a/g is ours)
Step time: start of each optimizer step on rank 0; steady state = median after the first --warmup fraction.
Memory: on GPU, torch.cuda.max_memory_allocated on rank 0; on CPU, rank 0's peak RSS and the growth of the peak
over the RSS at the first step (a Ray worker's RSS includes Ray itself, so the growth is the comparable part;
with the small CPU model both are dominated by allocator noise).
Throughput: tokens/s over all processes; MFU = 6 * params * tokens/s / (N * --peak-tflops) (GPU only).
Ratios are reported, never asserted.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import num_params, print_table, read_stamps, step_stats, write_stamps  # noqa: E402

TARGET = 1.05  # against the spawned loop (b)
TARGET_IN_RAY_TRAIN = 1.03  # against the same loop in Ray Train (g)


@dataclass
class Config:
    device: str = "cpu"
    workers: int = 2
    steps: int = 60
    batch: int = 8          # sequences per process per step
    seq: int = 64
    vocab: int = 1024
    dim: int = 128
    layers: int = 4
    heads: int = 4
    lr: float = 3e-4
    samples: int = 4096
    seed: int = 42
    warmup: float = 0.2
    peak_tflops: float = 989.0  # per GPU, dense bf16 (H100/H200 SXM)

    @classmethod
    def gpu(cls, **kw) -> "Config":  # GPT-2 small: 124M parameters (tied embeddings counted once)
        return cls(**{**dict(device="cuda", batch=8, seq=1024, vocab=50304, dim=768, layers=12, heads=12,
                             steps=60), **kw})


# ---------------------------------------------------------------------------------------------- model
class Block(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, cfg: Config):
        super().__init__()
        self.tok, self.pos = nn.Embedding(cfg.vocab, cfg.dim), nn.Embedding(cfg.seq, cfg.dim)
        self.blocks = nn.ModuleList([Block(cfg.dim, cfg.heads) for _ in range(cfg.layers)])
        self.ln = nn.LayerNorm(cfg.dim)
        self.head = nn.Linear(cfg.dim, cfg.vocab, bias=False)

    def forward(self, input_ids, labels=None):
        x = self.tok(input_ids) + self.pos(torch.arange(input_ids.shape[1], device=input_ids.device))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln(x))
        loss = None if labels is None else F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten())
        return {"loss": loss, "logits": logits}


def build_model(cfg: Config) -> GPT:
    torch.manual_seed(cfg.seed)
    return GPT(cfg)


class TokenRows(torch.utils.data.Dataset):
    """Random token rows, generated per index from the seed (pickles as its parameters only)."""

    def __init__(self, cfg: Config):
        self.n, self.seq, self.vocab, self.seed = cfg.samples, cfg.seq, cfg.vocab, cfg.seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        ids = torch.randint(0, self.vocab, (self.seq + 1,), generator=g)
        return {"input_ids": ids[:-1], "labels": ids[1:]}


def shard(model: nn.Module, cfg: Config):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
        if cfg.device == "cuda" else MixedPrecisionPolicy()
    for block in model.blocks:
        fully_shard(block, mp_policy=mp)
    fully_shard(model, mp_policy=mp, reshard_after_forward=False)


def memory_now() -> dict:
    with open("/proc/self/statm") as f:  # Linux: resident pages are the second field
        rss_mb = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    out = {"rss_mb": rss_mb, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda_peak_mb"] = torch.cuda.max_memory_allocated() / 2**20
    return out


# --------------------------------------------------------------------------------- hand-written loop
def hand_loop(cfg: Config, rank: int, world: int, stamp_path: str, device=None):
    import torch.distributed as dist
    from torch.utils.data import DataLoader

    if device is None:
        device = torch.device("cuda", rank) if cfg.device == "cuda" else torch.device("cpu")
    model = build_model(cfg).to(device)
    shard(model, cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    # Contiguous shards of the same global order raytrainer uses (seeded permutation per epoch).
    order = common.epoch_order(cfg.samples, cfg.seed, 0)
    per_step = cfg.batch * world
    rows = [order[s + rank * cfg.batch: s + (rank + 1) * cfg.batch] for s in range(0, cfg.samples, per_step)]
    loader = DataLoader(TokenRows(cfg), batch_sampler=rows)
    perf, wall, steps, first = [], [], [], None
    for step, batch in enumerate(loader):
        if step >= cfg.steps:
            break
        perf.append(time.perf_counter())
        wall.append(time.time())
        steps.append(step)
        first = first or memory_now()
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        loss = model(**batch)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if cfg.device == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    if rank == 0:
        write_stamps(stamp_path, perf, wall, steps, first=first, end=memory_now())


def _worker(rank: int, world: int, port: int, cfg: Config, path: str):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    if cfg.device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cfg.device == "cuda" else "gloo", rank=rank, world_size=world)
    hand_loop(cfg, rank, world, path)
    dist.destroy_process_group()


def run_hand(cfg: Config, workdir: str) -> dict:
    import torch.multiprocessing as mp

    port = common.free_port()
    path = os.path.join(workdir, "hand.json")
    mp.spawn(_worker, args=(cfg.workers, port, cfg, path), nprocs=cfg.workers, join=True)
    return read_stamps(path)


def _ray_train_loop(config: dict, rank: int, world: int, device):
    torch.set_num_threads(1)
    hand_loop(config["cfg"], rank, world, config["path"], device)


def run_ray_train_plain(cfg: Config, workdir: str) -> dict:
    """(g): the hand-written FSDP2 loop inside a bare Ray Train V2 TorchTrainer, so (a) / (g) is what raytrainer
    adds on top of Ray Train's worker group."""
    path = os.path.join(workdir, "ray-train-plain.json")
    common.run_in_bare_ray_train(_ray_train_loop, {"cfg": cfg, "path": path}, workdir, cfg.workers,
                                 use_gpu=cfg.device == "cuda")
    return read_stamps(path)


# ------------------------------------------------------------------------------------------ raytrainer
def run_raytrainer(cfg: Config, workdir: str) -> dict:
    import raytrainer

    timed = common.make_timed_trainer_class()

    class MemoryTimed(timed):
        def training_step(self, model, inputs, num_items_in_batch=None):
            if self.ctx.rank == 0 and getattr(self, "_b_first", None) is None:
                self._b_first = memory_now()
            loss = super().training_step(model, inputs, num_items_in_batch)
            if self.ctx.rank == 0 and self.state.global_step == self.state.max_steps - 1:
                if cfg.device == "cuda":
                    torch.cuda.synchronize()
                write_stamps(self._b_path, self._b_perf, self._b_wall, self._b_steps,
                             first=self._b_first, end=memory_now())
            return loss

    stamp_dir = tempfile.mkdtemp(prefix="rt-fsdp-", dir=workdir)
    args = raytrainer.TrainingArguments(
        output_dir=os.path.join(workdir, "out-rt"), num_workers=cfg.workers, strategy="fsdp", max_steps=cfg.steps,
        per_device_train_batch_size=cfg.batch, learning_rate=cfg.lr, weight_decay=0.0, optim="adamw_torch",
        lr_scheduler_type="constant", max_grad_norm=1.0, save_strategy="no", logging_steps=max(cfg.steps // 4, 1),
        disable_tqdm=True, seed=cfg.seed, bf16=cfg.device == "cuda", use_gpu=cfg.device == "cuda",
        fsdp_config={"transformer_layer_cls_to_wrap": ["Block"]})
    trainer = MemoryTimed(model=build_model(cfg), args=args, train_dataset=TokenRows(cfg))
    trainer.stamp_dir = stamp_dir
    trainer.pop_callback(raytrainer.PrinterCallback)
    trainer.train()
    trainer.close()  # its idle worker group would hold the CPUs a Ray variant run next in this Ray needs
    files = [f for f in os.listdir(stamp_dir) if f.startswith("rank0-")]
    return read_stamps(os.path.join(stamp_dir, files[0]))


# ---------------------------------------------------------------------------------------------- report
def summarise(stamps: dict, cfg: Config, params: int) -> dict:
    stats = step_stats(stamps["perf"], cfg.warmup)
    tokens_per_s = cfg.batch * cfg.seq * cfg.workers / (stats["median_ms"] / 1e3)
    out = {**stats, "tokens_per_s": tokens_per_s, "peak_rss_mb": stamps["end"]["peak_rss_mb"],
           "rss_growth_mb": stamps["end"]["peak_rss_mb"] - stamps["first"]["rss_mb"]}
    if "cuda_peak_mb" in stamps["end"]:
        out["cuda_peak_mb"] = stamps["end"]["cuda_peak_mb"]
        out["mfu"] = 6 * params * tokens_per_s / (cfg.workers * cfg.peak_tflops * 1e12)
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--gpus", type=int, default=None, help="processes on GPU (default: all visible GPUs)")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=1, help="rounds of the variants; ratios are paired per round")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="per-GPU dense bf16 peak, for MFU")
    parser.add_argument("--variants", default="ba", help="letters from abg, run in this order each round")
    parser.add_argument("--json", default=None)
    opts = parser.parse_args(argv)
    opts.variants = [v for v in opts.variants if v in "abg"]
    if opts.device == "cuda":
        cfg = Config.gpu(workers=opts.gpus or torch.cuda.device_count(), peak_tflops=opts.peak_tflops)
    else:
        cfg = Config()
    if opts.steps:
        cfg.steps = opts.steps
    cfg.samples = max(cfg.samples, cfg.steps * cfg.batch * cfg.workers)
    params = num_params(build_model(cfg))
    common.ship_by_value()
    import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    common.quiet_ray_logs()
    print(f"model: GPT dim={cfg.dim} layers={cfg.layers} heads={cfg.heads} vocab={cfg.vocab} seq={cfg.seq} "
          f"({params / 1e6:.1f}M params), {cfg.workers} x {cfg.device}, batch {cfg.batch}/process, {cfg.steps} steps, "
          f"{'bf16' if cfg.device == 'cuda' else 'fp32'}", flush=True)
    runners = {"b": run_hand, "g": run_ray_train_plain, "a": run_raytrainer}
    names = {"b": "hand-written FSDP2", "g": "hand-written FSDP2 in a bare TorchTrainer", "a": "raytrainer fsdp"}
    rounds = []
    for r in range(opts.repeats):
        workdir = tempfile.mkdtemp(prefix="raytrainer-bench-fsdp-")
        results = {}
        try:
            for v in opts.variants:
                if v == "b":
                    common.stop_ray()  # never run the spawn baseline next to an idle Ray
                else:
                    import ray

                    if not ray.is_initialized():
                        common.start_ray(num_cpus=max(cfg.workers + 1, 2) if cfg.device == "cpu" else None)
                print(f"[round {r + 1}] ({v}) {names[v]} ...", flush=True)
                results[v] = summarise(runners[v](cfg, workdir), cfg, params)
                print(f"    median {results[v]['median_ms']:.2f} ms/step, load {os.getloadavg()[0]:.1f}", flush=True)
        finally:
            common.stop_ray()
            shutil.rmtree(workdir, ignore_errors=True)
        rounds.append({**results, "load_after": os.getloadavg()[0]})
    report(cfg, params, rounds, opts)


def report(cfg: Config, params: int, rounds: list, opts):
    med = lambda v, k: statistics.median(r[v][k] for r in rounds)  # noqa: E731
    keys = ["median_ms", "p25_ms", "p75_ms", "tokens_per_s", "peak_rss_mb", "rss_growth_mb"]
    if cfg.device == "cuda":
        keys += ["cuda_peak_mb", "mfu"]
    names = {"a": "(a) raytrainer fsdp", "b": "(b) hand-written FSDP2", "g": "(g) hand FSDP2 in bare Ray Train"}
    rows = [[names[v]] + [med(v, k) for k in keys] for v in opts.variants]
    loads = " ".join(f"{r['load_after']:.1f}" for r in rounds)
    print_table(f"FSDP, {cfg.workers} x {cfg.device} ({len(rounds)} round(s), 1-min load average after each: "
                f"{loads})", ["variant"] + keys, rows)
    mem_key = "cuda_peak_mb" if cfg.device == "cuda" else "rss_growth_mb"
    ratios, rows = {}, []
    for base in (v for v in "bg" if v in opts.variants and "a" in opts.variants):
        per_round = [r["a"]["median_ms"] / r[base]["median_ms"] for r in rounds]
        ratios[f"step_time a/{base}"] = statistics.median(per_round)
        rows.append([f"step_time a/{base}", ratios[f"step_time a/{base}"], " ".join(f"{x:.3f}" for x in per_round),
                     f"<= {TARGET if base == 'b' else TARGET_IN_RAY_TRAIN}"])
        ratios[f"{mem_key} a/{base}"] = statistics.median(
            r["a"][mem_key] / r[base][mem_key] if r[base][mem_key] >= 1 else float("nan") for r in rounds)
        ratios[f"peak_rss a/{base}"] = statistics.median(r["a"]["peak_rss_mb"] / r[base]["peak_rss_mb"] for r in rounds)
        rows += [[f"{mem_key} a/{base}", ratios[f"{mem_key} a/{base}"], "", "info"],
                 [f"peak_rss a/{base}", ratios[f"peak_rss a/{base}"], "", "info"]]
        if cfg.device == "cuda":
            ratios[f"mfu a/{base}"] = statistics.median(r["a"]["mfu"] / r[base]["mfu"] for r in rounds)
            rows.append([f"mfu a/{base}", ratios[f"mfu a/{base}"], "", "info"])
    print_table("Ratios (reported, not asserted; median of the rounds' ratios)", ["ratio", "value", "per round",
                                                                                   "target"], rows)
    common.write_json(opts.json, {"benchmark": "fsdp", "config": asdict(cfg), "params": params, "rounds": rounds,
                                  "ratios": ratios, "machine": common.machine_info()})


if __name__ == "__main__":
    main()
