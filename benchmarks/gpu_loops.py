"""The workloads of benchmarks/gpu.py and the two loops that train them: raytrainer's own (`run_raytrainer`) and the
hand-written one (`hand_loop`), which gpu.py runs on the same warm worker group as a script:

    raytrainer.launch("benchmarks/gpu_loops.py", [SPEC_JSON_PATH])

so that the processes, Ray Train's worker group, the process group and the GPU are the same ones and only the loop
differs (paired.py's method). Both sides build the model on the device from the same seed (a 1B model's init on
the host alone takes ~20 s), see the same rows (fsdp.py's TokenRows, made in code), and use the same precision
(bf16 autocast; under FSDP2 a bf16 MixedPrecisionPolicy instead), optimizer (AdamW, fused on GPU), clipping
(max norm 1.0), per-block torch.compile and, under FSDP2, fully_shard per block then the root, as raytrainer does.
A log step reads the loss on the host in both (what a hand loop prints).

Rank 0 writes its step-start stamps and figures to a JSON file: peak GPU memory (torch.cuda.max_memory_allocated
over the memory held before the model was built; on CPU the process's peak RSS, which is not comparable between
two runs in one process), the device's name and its peak FLOP/s for the precision used
(raytrainer.worker.throughput), and, with `profile`, a torch.profiler summary of a few steady steps.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import sys
import tempfile
import time
import types
from dataclasses import asdict, dataclass, field

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import fsdp  # noqa: E402

_MEMORY_BASE = {}  # bytes held on this worker's device before the run's model was built (per process)


@dataclass
class Workload:
    model: str                  # "gpt": fsdp.py's GPT (size: fsdp.Config fields); "llama": LlamaForCausalLM
    size: dict = field(default_factory=dict)  # LlamaConfig fields for "llama"
    strategy: str = "ddp"       # "ddp" (one GPU: no wrapper, as raytrainer on one worker) or "fsdp"
    device: str = "cuda"
    world: int = 1              # workers (GPUs)
    bf16: bool = True
    compile: bool = False
    compile_backend: str = "inductor"
    steps: int = 40
    batch: int = 8              # sequences per worker per step
    seq: int = 1024
    lr: float = 3e-4
    log_every: int = 10
    seed: int = 42
    warmup: float = 0.25        # fraction of step durations dropped (compiled runs recompile in the first steps)
    profile_steps: int = 0      # > 0: a torch.profiler window over the last that many steps (rank 0)

    @property
    def vocab(self) -> int:
        return self.size["vocab"] if self.model == "gpt" else self.size["vocab_size"]

    @property
    def optim(self) -> str:
        # FSDP2's DTensor parameters keep the foreach AdamW (fsdp.py's choice, run on GPUs before); fused elsewhere.
        return "adamw_torch_fused" if self.device == "cuda" and self.strategy != "fsdp" else "adamw_torch"

    @property
    def precision(self) -> str:
        return "bf16" if self.bf16 else "fp32"

    def gpt_config(self) -> fsdp.Config:
        return fsdp.Config(**{**self.size, "device": self.device, "seq": self.seq, "batch": self.batch,
                              "seed": self.seed})

    def rows(self) -> torch.utils.data.Dataset:
        samples = self.steps * self.batch * self.world
        return fsdp.TokenRows(types.SimpleNamespace(samples=samples, seq=self.seq, vocab=self.vocab, seed=self.seed))


def device_of(w: Workload) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if w.device == "cuda" else torch.device("cpu")


def build_model(w: Workload) -> torch.nn.Module:
    """The workload's model, built on the device; first notes what the device holds (the run's memory base)."""
    device = device_of(w)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()  # what an earlier run in this process left cached does not count
        torch.cuda.reset_peak_memory_stats(device)
        _MEMORY_BASE["bytes"] = torch.cuda.memory_allocated(device)
    torch.manual_seed(w.seed)
    with device:
        if w.model == "gpt":
            return fsdp.GPT(w.gpt_config())
        from transformers import LlamaConfig, LlamaForCausalLM

        return LlamaForCausalLM(LlamaConfig(**w.size, use_cache=False, attn_implementation="sdpa"))


def meta_llama(w: Workload) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    with torch.device("meta"):  # shapes only: no memory, no init
        return LlamaForCausalLM(LlamaConfig(**w.size, use_cache=False))


def llama_flops_per_token(w: Workload) -> float:
    """raytrainer's own FLOPs estimate (6 N + 12 L H Q T per token)."""
    from raytrainer.worker.throughput import ModelFlops

    flops = ModelFlops.of(meta_llama(w))
    return flops.dense + flops.attention * w.seq


def llama_params(w: Workload) -> int:
    return common.num_params(meta_llama(w))


def blocks(model: torch.nn.Module) -> list:
    return list(model.blocks) if hasattr(model, "blocks") else list(model.model.layers)


def figures(w: Workload) -> dict:
    """What rank 0 writes beside its stamps, read at the end of a run."""
    from raytrainer.worker.throughput import peak_flops

    device = device_of(w)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device) - _MEMORY_BASE.get("bytes", 0)
        return {"peak_mem_mb": peak / 2**20, "device_name": torch.cuda.get_device_name(device),
                "peak_flops": peak_flops(device, precision=w.precision), "process": process_facts()}
    return {"peak_mem_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "device_name": "cpu",
            "peak_flops": None}


class StepProfile:
    """A torch.profiler window over `steps` steps starting at `start`: the top kernels (or CPU ops) by self time
    and the device's busy share of the window (its complement: host gaps, syncs and launch latency)."""

    def __init__(self, start: int, steps: int, device: torch.device):
        self.start, self.end, self.device = start, start + steps, device
        self.prof, self.summary, self.t0 = None, None, 0.0

    def step(self, step: int):
        if not self.end > self.start:
            return
        if step == self.start:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.device.type == "cuda" else [])
            self.prof = profile(activities=activities)
            self.prof.__enter__()
            self.t0 = time.perf_counter()
        elif step == self.end and self.prof is not None:
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            window_us = 1e6 * (time.perf_counter() - self.t0)
            self.prof.__exit__(None, None, None)
            self.summary = summarise_profile(self.prof, window_us, self.device.type == "cuda")
            self.prof = None


# The host-side calls that wait for the device (a sync), and the ops that read a device value on the host.
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
              "cudaMemcpyAsync", "aten::_local_scalar_dense", "aten::item")


def summarise_profile(prof, window_us: float, cuda: bool, top: int = 8) -> dict:
    """Where a window's time goes: `top` kernels (or CPU ops) by self time, the device's busy share, the host's
    waits on the device (`syncs`: name -> [count, host ms]) and the host ops with most self CPU time."""
    events = prof.key_averages()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    busy = sum(getattr(e, key, 0) for e in events) / window_us if cuda else None  # kernels only have device time
    ranked = sorted(events, key=lambda e: getattr(e, key, 0), reverse=True)[:top]
    host = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return {"window_ms": window_us / 1e3, "device_busy_share": busy,
            "top": [[e.key[:60], round(getattr(e, key, 0) / 1e3, 3), e.count] for e in ranked],
            "host_top": [[e.key[:60], round(e.self_cpu_time_total / 1e3, 3), e.count] for e in host],
            "syncs": {e.key: [e.count, round(e.cpu_time_total / 1e3, 3)] for e in events if e.key in SYNC_CALLS}}


def process_facts() -> dict:
    """What in this process could make the same loop slower here than elsewhere: threads, the switch interval,
    torch's thread count and determinism, TF32, the process's niceness and allowed cores, the variables CUDA
    reads."""
    import threading

    matmul = torch.backends.cuda.matmul
    return {"threads": sorted(t.name for t in threading.enumerate()), "switch_interval": sys.getswitchinterval(),
            "torch_threads": torch.get_num_threads(), "deterministic": torch.are_deterministic_algorithms_enabled(),
            "cudnn_benchmark": torch.backends.cudnn.benchmark, "tf32": bool(matmul.allow_tf32),
            "niceness": os.nice(0), "cpus_allowed": len(os.sched_getaffinity(0)),
            "env": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_LAUNCH_BLOCKING", "OMP_NUM_THREADS",
                                                   "LOCAL_RANK", "WORLD_SIZE") if k in os.environ}}


# --------------------------------------------------------------------------------------- the hand loop
def hand_loop(w: Workload, stamp_path: str):
    """The loop one would write by hand for the workload, on this rank (in a process group when one is up)."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    device = device_of(w)
    model = build_model(w)
    if w.compile:
        for block in blocks(model):
            block.compile(backend=w.compile_backend)
    sharded = w.strategy == "fsdp" and dist.is_initialized()
    if sharded:
        fsdp.shard(model, w.gpt_config())  # per block, then the root; bf16 MixedPrecisionPolicy on GPU
    elif world > 1:
        model = DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    autocast_on = w.bf16 and not sharded  # FSDP2 casts the parameters itself
    optimizer = torch.optim.AdamW(model.parameters(), lr=w.lr, weight_decay=0.0,
                                  fused=True if w.optim == "adamw_torch_fused" else None)
    sampler = common.ContiguousShardSampler(w.steps * w.batch * world, w.batch, rank, world, w.seed)
    loader = DataLoader(w.rows(), batch_sampler=sampler, pin_memory=device.type == "cuda")
    profile = StepProfile(w.steps - w.profile_steps, w.profile_steps if rank == 0 else 0, device)
    perf = []
    model.train()
    for step, batch in enumerate(loader):
        profile.step(step)
        perf.append(time.perf_counter())
        batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast_on):
            loss = model(**batch)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if (step + 1) % w.log_every == 0:  # the mean loss over ranks, read on the host, as a hand loop prints it
            logged = loss.detach().clone()
            if world > 1:
                dist.all_reduce(logged)
            logged.item()
    profile.step(len(perf))
    if rank == 0:
        common.write_stamps(stamp_path, perf, [], [], profile=profile.summary, **figures(w))
    del model, optimizer
    gc.collect()


# ------------------------------------------------------------------------------------------ raytrainer
def _build_for_trainer(spec: dict) -> torch.nn.Module:
    return build_model(Workload(**spec))


def run_raytrainer(w: Workload, workdir: str) -> dict:
    """raytrainer's loop on the workload (the pool's group, left warm for the next run); rank 0's stamps."""
    import functools

    import raytrainer

    timed = common.make_timed_trainer_class()

    class Measured(timed):
        def training_step(self, model, inputs, num_items_in_batch=None):
            if getattr(self, "_g_profile", None) is None:
                self._g_profile = StepProfile(w.steps - w.profile_steps,
                                              w.profile_steps if self.ctx.rank == 0 else 0, device_of(w))
            self._g_profile.step(self.state.global_step)
            loss = super().training_step(model, inputs, num_items_in_batch)
            if self.ctx.rank == 0 and self.state.global_step == self.state.max_steps - 1:
                self._g_profile.step(self.state.global_step + 1)
                common.write_stamps(self._b_path, self._b_perf, self._b_wall, self._b_steps,
                                    profile=self._g_profile.summary, **figures(w))
            return loss

    stamp_dir = tempfile.mkdtemp(prefix="rt-gpu-", dir=workdir)
    cuda = w.device == "cuda"
    args = raytrainer.TrainingArguments(
        output_dir=os.path.join(workdir, "out-rt"), num_workers=w.world, strategy=w.strategy,
        max_steps=w.steps, per_device_train_batch_size=w.batch, learning_rate=w.lr, weight_decay=0.0, optim=w.optim,
        lr_scheduler_type="constant", max_grad_norm=1.0, save_strategy="no", logging_steps=w.log_every,
        disable_tqdm=True, seed=w.seed, bf16=w.bf16, use_gpu=cuda, dataloader_pin_memory=cuda,
        torch_compile=w.compile, torch_compile_backend=w.compile_backend if w.compile else None,
        fsdp_config={"transformer_layer_cls_to_wrap": ["Block"]} if w.strategy == "fsdp" else None)
    trainer = Measured(model_init=functools.partial(_build_for_trainer, asdict(w)), args=args,
                       train_dataset=w.rows())
    trainer.stamp_dir = stamp_dir
    trainer.pop_callback(raytrainer.PrinterCallback)
    trainer.train()  # no close(): the group stays in the pool, for the hand loop's launch and the next run
    files = [f for f in os.listdir(stamp_dir) if f.startswith("rank0-")]
    return common.read_stamps(os.path.join(stamp_dir, files[0]))


def run_hand(w: Workload, workdir: str, tag: str) -> dict:
    """The hand loop on the same (warm) worker group, through raytrainer.launch."""
    import raytrainer

    spec, stamps = os.path.join(workdir, f"{tag}-spec.json"), os.path.join(workdir, f"{tag}-stamps.json")
    with open(spec, "w") as f:
        json.dump(asdict(w), f)
    raytrainer.launch(os.path.abspath(__file__), [spec, stamps], num_workers=w.world, use_gpu=w.device == "cuda",
                      disable_tqdm=True, resume=False)
    return common.read_stamps(stamps)


if __name__ == "__main__":  # on each rank of the group, under raytrainer.launch
    with open(sys.argv[1]) as spec_file:
        hand_loop(Workload(**json.load(spec_file)), sys.argv[2])
