"""One command for a GPU machine: raytrainer against what a user would otherwise run, in one table and one JSON.

    python3 benchmarks/gpu.py --rounds 3 --json /tmp/gpu.json          # all parts, <= 7 min on one GPU
    python3 benchmarks/gpu.py --parts own:ddp,hosted --budget-s 300      # a shorter second run
    python benchmarks/gpu.py --device cpu --smoke --json /tmp/gpu.json   # every part on tiny models (CI, ~1 min)

Parts (`--parts`, all by default; `own:ddp` or `hosted:fsdp` runs one strategy of a part), G = the visible GPUs
(1 worker on CPU):
  own     raytrainer's loop against the hand-written loop (benchmarks/gpu_loops.py: same model, rows, bf16, fused
          AdamW, clipping, per-block compile and sharding), both on the same warm worker group (the hand loop through
          raytrainer.launch, paired.py's method), DDP and FSDP2, alternating order, --rounds rounds: median and p25
          step time per side, the per-round ratio. The model: fsdp.py's 163M GPT at sequence 1024, batch 8 a GPU.
  mfu     a 1B-class Llama (hidden 2048, 16 layers, 32 heads, 8 KV heads, intermediate 8192, vocab 32000; 1.1B
          parameters) at sequence 2048, bf16, SDPA, built from its config on the device, in both loops: tokens/s,
          MFU (raytrainer's FLOPs estimate over the device's peak for bf16, raytrainer.worker.throughput), peak GPU
          memory; torch_compile on, then off while the time budget lasts (--no-compile: off only; --smoke: on
          only, with the "eager" backend: dynamo's tracing without inductor's minutes of C++ compiling on a CPU).
  hosted  one plain transformers.Trainer script (gpu_hosted_script.py) under `raytrainer launch --num_workers G`
          against `torchrun --nproc_per_node G`, alternating, step time from the script's own stamps; once with
          DDP, once with HF's fsdp="full_shard" (accelerate's FSDP cannot run on CPU: skipped there, said so).
Where a target is missed, one more short run of each side records a torch.profiler summary (top kernels, the
device's busy share of the window, the host's waits on the device, the host ops with most CPU time) in the JSON,
printed under the table (--profile never|auto|always). Each side also records what in its process could make the
same loop slower (threads, switch interval, determinism, TF32, accelerate's mode: gpu_loops.process_facts).

On a GPU, rounds after the first are run only while the --budget-s left covers the parts after them, and the JSON
is written after every part ("complete": false until the end, "rounds_run" per comparison): a run stopped by the
GPU machine's time limit keeps what it measured.

One Ray and one worker group serve every part (raytrainer's pool keeps the group of the first run for the next
ones). Step time is the median of rank 0's step durations after the first quarter. Ratios are reported, never
asserted. Targets (issue 42): own/hand and hosted/torchrun <= 1.03, MFU own >= hand - 0.01 and >= 0.40 on an
H100/H200, peak memory own/hand <= 1.05.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
import gpu_loops  # noqa: E402
import hosted_ladder  # noqa: E402
from gpu_loops import Workload  # noqa: E402

PARTS = ("own", "mfu", "hosted")
STRATEGIES = ("ddp", "fsdp")  # of the own and hosted parts
# ladder: the same script plain, in a bare Ray actor and launched (1 worker); before HF's FSDP, whose rounds are long
HOSTED_VARIANTS = ("ddp", "ladder", "fsdp")
HOSTED_SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_hosted_script.py")
TARGET_STEP, TARGET_MEM, TARGET_MFU = 1.03, 1.05, 0.40

# fsdp.py's GPT-2-small-shaped model (163M with its untied head) on a GPU; a tiny one for the smoke run.
GPT = {"gpu": (dict(vocab=50304, dim=768, layers=12, heads=12), dict(seq=1024, batch=8, steps=40, log_every=10)),
       "smoke": (dict(vocab=128, dim=32, layers=2, heads=2), dict(seq=16, batch=4, steps=8, log_every=4))}
LLAMA = {"gpu": (dict(vocab_size=32000, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                      num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=2048),
                 dict(seq=2048, batch=4, steps=24, log_every=8)),
         "smoke": (dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32),
                   dict(seq=32, batch=2, steps=8, log_every=4))}
HOSTED_STEPS = {"gpu": 120, "smoke": 8}
PROFILE_STEPS = 5  # the steps a profiled run's window covers (the hosted part's: the last of its steps)
# On a GPU the run must end inside gpu-perf.sh's 480 s limit, or what it measured is lost with it: rounds after the
# first are run only while this much of --budget-s is left (the 1B model's compile and the hosted part come after
# `own`; a hosted round is 2 launches of HOSTED_STEPS), and the JSON is written after every part.
RESERVE_AFTER_OWN_S, RESERVE_HOSTED_ROUND_S = 240.0, 45.0
RESERVE_LADDER_ROUND_S = 60.0  # three runs of the script: plain, in a bare Ray actor, launched


class Clock:
    """The run's time budget: optional work is skipped once what is left would not cover it."""

    def __init__(self, budget_s: float):
        self.t0, self.budget = time.time(), budget_s

    def left(self) -> float:
        return self.budget - (time.time() - self.t0)


def side(stamps: dict, w: Workload) -> dict:
    perf = stamps["perf"][:len(stamps["perf"]) - w.profile_steps or None]
    stats = common.step_stats(perf, w.warmup)
    tokens_per_s = w.batch * w.seq * w.world / (stats["median_ms"] / 1e3)
    return {**stats, "tokens_per_s": tokens_per_s, "peak_mem_mb": stamps.get("peak_mem_mb"),
            "device_name": stamps.get("device_name"), "peak_flops": stamps.get("peak_flops"),
            "profile": stamps.get("profile"), "process": stamps.get("process")}


def pair(w: Workload, workdir: str, tag: str, hand_first: bool) -> dict:
    """One round: the hand loop and raytrainer's on the same group, in the given order."""
    out = {}
    for name in ("hand", "own") if hand_first else ("own", "hand"):
        stamps = gpu_loops.run_hand(w, workdir, f"{tag}-{name}") if name == "hand" \
            else gpu_loops.run_raytrainer(w, workdir)
        out[name] = side(stamps, w)
        print(f"    {tag} {name}: {out[name]['median_ms']:.2f} ms/step (p25 {out[name]['p25_ms']:.2f})", flush=True)
    out["ratio"] = out["own"]["median_ms"] / out["hand"]["median_ms"]
    return out


def profile_pair(w: Workload, workdir: str, tag: str) -> dict:
    """A short profiled run of each side (top kernels, device busy share) for a missed target."""
    short = replace(w, steps=max(8, w.steps // 2), profile_steps=3)
    got = pair(short, workdir, f"{tag}-profile", hand_first=True)
    return {name: got[name]["profile"] for name in ("hand", "own")}


# ---------------------------------------------------------------------------------------------------- parts
def part_own(opts, workdir: str, clock: Clock) -> dict:
    size, shape = GPT[opts.size]
    results = {}
    for strategy in opts.strategies["own"]:
        w = Workload(model="gpt", size=size, strategy=strategy, device=opts.device, bf16=opts.bf16, world=opts.world,
                     **shape)
        rounds = [pair(w, workdir, f"own-{strategy}-r{r}", hand_first=r % 2 == 0) for r in range(opts.rounds)
                  if r == 0 or clock.left() > RESERVE_AFTER_OWN_S or opts.device != "cuda"]
        ratios = [r["ratio"] for r in rounds]
        result = {"rounds": rounds, "ratios": ratios, "median": statistics.median(ratios)}
        if want_profile(opts, result["median"] > TARGET_STEP, clock, 60):
            result["profile"] = profile_pair(w, workdir, f"own-{strategy}")
        results[strategy] = result
    return results


def part_mfu(opts, workdir: str, clock: Clock) -> dict:
    size, shape = LLAMA[opts.size]
    compiles = [False] if opts.no_compile else [True] if opts.smoke else [True, False]
    flops_per_token = None
    results = {}
    for compiled in compiles:
        if compiled is False and len(compiles) > 1 and clock.left() < (150 if opts.device == "cuda" else 0):
            results["off"] = {"skipped": f"time budget ({clock.left():.0f} s left)"}
            continue
        w = Workload(model="llama", size=size, device=opts.device, bf16=opts.bf16, world=opts.world,
                     compile=compiled, compile_backend="inductor" if opts.device == "cuda" else "eager", **shape)
        flops_per_token = flops_per_token or gpu_loops.llama_flops_per_token(w)
        got = pair(w, workdir, f"mfu-{'on' if compiled else 'off'}", hand_first=True)
        for name in ("hand", "own"):
            got[name]["mfu"] = mfu(got[name], flops_per_token, w.world, opts)
        got["peak_mem_ratio"] = got["own"]["peak_mem_mb"] / got["hand"]["peak_mem_mb"]
        missed = got["own"]["mfu"] < got["hand"]["mfu"] - 0.01 or got["peak_mem_ratio"] > TARGET_MEM
        if want_profile(opts, missed, clock, 120):
            got["profile"] = profile_pair(w, workdir, "mfu")
        results["on" if compiled else "off"] = got
    return {"flops_per_token": flops_per_token, "params": gpu_loops.llama_params(Workload(model="llama", size=size)),
            **results}


def mfu(figures: dict, flops_per_token: float, world: int, opts) -> float:
    peak = figures["peak_flops"] or opts.cpu_peak_flops  # the CPU's is nominal (smoke): no such table for CPUs
    return flops_per_token * figures["tokens_per_s"] / (world * peak)


def part_hosted(opts, workdir: str, clock: Clock) -> dict:
    results = {}
    for variant in opts.strategies["hosted"]:
        if variant == "fsdp" and opts.device != "cuda":
            results[variant] = {"skipped": "accelerate's FSDP cannot run on CPU"}
            continue
        if variant == "ladder" and opts.world > 1:
            results[variant] = {"skipped": "compares with one plain process: one worker only"}
            continue
        try:  # one variant's failure (HF's FSDP) must not lose the other's figures
            results[variant] = (hosted_ladder_rounds if variant == "ladder" else hosted_variant)(
                variant, opts, workdir, clock)
        except Exception as exc:
            results[variant] = {"error": f"{type(exc).__name__}: {exc}"}
            print(f"    hosted {variant} failed: {results[variant]['error'][:400]}", flush=True)
    hosted_ladder.stop_actor()
    return results


def hosted_variant(variant: str, opts, workdir: str, clock: Clock) -> dict:
    rounds = []
    for r in range(opts.rounds):
        if r > 0 and opts.device == "cuda" and clock.left() < RESERVE_HOSTED_ROUND_S:
            break  # the rounds run are in the JSON; a killed run would have left none
        order = ("torchrun", "launch") if r % 2 == 0 else ("launch", "torchrun")
        got = {name: run_hosted(name, variant, opts, workdir, f"{variant}-r{r}") for name in order}
        got["ratio"] = got["launch"]["steady_step_ms"] / got["torchrun"]["steady_step_ms"]
        print(f"    hosted {variant} r{r}: launch {got['launch']['steady_step_ms']:.2f} ms, torchrun "
              f"{got['torchrun']['steady_step_ms']:.2f} ms", flush=True)
        rounds.append(got)
    ratios = [r["ratio"] for r in rounds]
    result = {"rounds": rounds, "ratios": ratios, "median": statistics.median(ratios)}
    if want_profile(opts, result["median"] > TARGET_STEP, clock, RESERVE_HOSTED_ROUND_S):
        try:  # the rounds above stand without it
            result["profile"] = {name: run_hosted(name, variant, opts, workdir, f"{variant}-profile", profile=True)
                                 for name in ("torchrun", "launch")}
        except Exception as exc:
            result["profile"] = {"error": f"{type(exc).__name__}: {exc}"}
    return result


def hosted_ladder_rounds(variant: str, opts, workdir: str, clock: Clock) -> dict:
    """hosted_ladder.py: the script plain, in a bare Ray actor and launched, in a rotating order each round;
    each one's steady step over plain's."""
    rounds = []
    for r in range(opts.rounds):
        if opts.device == "cuda" and clock.left() < RESERVE_LADDER_ROUND_S:
            break  # even the first: gpu-perf.sh's limit would lose it with the rest of the run
        order = hosted_ladder.LAUNCHERS[r % 3:] + hosted_ladder.LAUNCHERS[:r % 3]
        got = {name: run_hosted(name, "ddp", opts, workdir, f"ladder-r{r}") for name in order}
        step = {name: got[name]["steady_step_ms"] for name in hosted_ladder.LAUNCHERS}
        got["ratio"], got["actor_ratio"] = step["launch"] / step["plain"], step["actor"] / step["plain"]
        print(f"    ladder r{r}: " + ", ".join(f"{name} {ms:.2f} ms" for name, ms in step.items()), flush=True)
        rounds.append(got)
    if not rounds:
        return {"skipped": f"time budget ({clock.left():.0f} s left)"}
    ratios, actor_ratios = [r["ratio"] for r in rounds], [r["actor_ratio"] for r in rounds]
    return {"rounds": rounds, "ratios": ratios, "median": statistics.median(ratios), "actor_ratios": actor_ratios,
            "actor_median": statistics.median(actor_ratios)}


def run_hosted(launcher: str, variant: str, opts, workdir: str, tag: str, profile: bool = False) -> dict:
    import raytrainer

    stamps = os.path.join(workdir, f"hosted-{launcher}-{tag}.json")
    steps = HOSTED_STEPS[opts.size] // 2 if profile else HOSTED_STEPS[opts.size]
    script_args = ["--output_dir", os.path.join(workdir, f"hosted-{launcher}-{tag}"), "--stamps", stamps,
                   "--max_steps", str(steps), "--size", opts.size] + (["--fsdp"] if variant == "fsdp" else []) + \
        (["--profile", str(min(PROFILE_STEPS, steps // 2))] if profile else [])
    called, cpu_before, busy_before = time.time(), time.process_time(), common.machine_busy_s()
    if launcher == "launch":
        raytrainer.launch(HOSTED_SCRIPT, script_args, num_workers=opts.world, use_gpu=opts.device == "cuda",
                          disable_tqdm=True, resume=False)
    elif launcher == "plain":
        hosted_ladder.run_plain(HOSTED_SCRIPT, script_args, opts.device)
    elif launcher == "actor":
        hosted_ladder.run_in_actor(HOSTED_SCRIPT, script_args, opts.device)
    else:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        if opts.device != "cuda":
            env["ACCELERATE_USE_CPU"] = "true"  # as the hosted job has it on CPU workers
        subprocess.run([*common.torchrun_command(opts.world), HOSTED_SCRIPT, *script_args], check=True, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # the script's start, train begin, every step end (wall clock); the facts of its process and its profile
    got, call_s = common.read_stamps(stamps), time.time() - called
    # This driver's CPU (launch: the job's pump runs here) and the whole machine's busy cores over the call.
    busy = {"driver_cpu_s": time.process_time() - cpu_before,
            "machine_busy_cores": (common.machine_busy_s() - busy_before) / call_s}
    return {**common.script_phases(got, called), "call_s": call_s, **busy,
            **{k: got.get(k) for k in ("process", "parallel_mode", "distributed_type", "profile", "cpu_per_step")}}


def want_profile(opts, missed: bool, clock: Clock, needs_s: float) -> bool:
    return opts.profile == "always" or (opts.profile == "auto" and missed and clock.left() > needs_s)


# --------------------------------------------------------------------------------------------------- report
@functools.lru_cache(maxsize=None)  # asked at every part's write
def nvidia_smi() -> dict:
    try:
        line = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        name, driver = (x.strip() for x in line.split(","))
        return {"gpu": name, "driver": driver}
    except (OSError, subprocess.SubprocessError, IndexError, ValueError):
        return {}


def write(opts, parts: dict, clock: Clock, complete: bool) -> dict:
    head = {**summary(opts, parts, time.time() - clock.t0), "complete": complete}
    common.write_json(opts.json, {**head, "parts": parts, "options": vars(opts), "machine": common.machine_info()})
    return head


def summary(opts, parts: dict, elapsed: float) -> dict:
    smi = nvidia_smi()
    own, mfu_part, hosted_part = parts.get("own") or {}, parts.get("mfu") or {}, parts.get("hosted") or {}
    compiled = mfu_part.get("on") or mfu_part.get("off") or {}
    return {
        "device": smi.get("gpu") or ("cpu" if opts.device == "cpu" else torch.cuda.get_device_name(0)),
        "driver": smi.get("driver"), "torch": torch.__version__, "date": datetime.date.today().isoformat(),
        "rounds": opts.rounds, "rounds_run": {f"{part}_{key}": len(got["rounds"]) for part in ("own", "hosted")
                                               for key, got in (parts.get(part) or {}).items() if "rounds" in got},
        "workers": opts.world, "smoke": opts.smoke, "elapsed_s": round(elapsed, 1),
        "own_over_hand_ddp": (own.get("ddp") or {}).get("median"),
        "own_over_hand_fsdp": (own.get("fsdp") or {}).get("median"),
        "hosted_over_torchrun": (hosted_part.get("ddp") or {}).get("median"),
        "hosted_over_torchrun_fsdp": (hosted_part.get("fsdp") or {}).get("median"),
        "hosted_over_plain": (hosted_part.get("ladder") or {}).get("median"),
        "ray_actor_over_plain": (hosted_part.get("ladder") or {}).get("actor_median"),
        "mfu_own_1b": (compiled.get("own") or {}).get("mfu"), "mfu_hand_1b": (compiled.get("hand") or {}).get("mfu"),
        "mfu_compiled": "on" in mfu_part and "own" in mfu_part["on"],
        "peak_mem_own_over_hand": compiled.get("peak_mem_ratio"),
    }


def table(opts, head: dict, parts: dict):
    rows = [[f"{name}: failed", "-", "-", "-", part["error"][:80], "", ""]
            for name, part in parts.items() if "error" in part]
    parts = {name: part for name, part in parts.items() if "error" not in part}
    met = lambda ok: "-" if ok is None else ("yes" if ok else "NO")  # noqa: E731
    for strategy, result in (parts.get("own") or {}).items():
        of = {k: {stat: statistics.median(r[k][stat] for r in result["rounds"]) for stat in ("median_ms", "p25_ms")}
              for k in ("own", "hand")}
        rows.append([f"own/hand step ms, {strategy}", f"{of['own']['median_ms']:.2f} (p25 {of['own']['p25_ms']:.2f})",
                     f"{of['hand']['median_ms']:.2f} (p25 {of['hand']['p25_ms']:.2f})", result["median"],
                     " ".join(f"{x:.3f}" for x in result["ratios"]), f"<= {TARGET_STEP}",
                     met(result["median"] <= TARGET_STEP)])
    mfu_part = parts.get("mfu") or {}
    for key in ("on", "off"):
        got = mfu_part.get(key)
        if not got:
            continue
        if "skipped" in got or "error" in got:
            rows.append([f"1B compile {key}", "-", "-", "-", got.get("skipped") or got["error"][:60], "", ""])
            continue
        own, hand = got["own"], got["hand"]
        floor = TARGET_MFU if opts.device == "cuda" else 0.0
        rows += [[f"1B tokens/s, compile {key}", f"{own['tokens_per_s']:.0f}", f"{hand['tokens_per_s']:.0f}",
                  own["tokens_per_s"] / hand["tokens_per_s"], "", "", ""],
                 [f"1B MFU, compile {key}", f"{own['mfu']:.3f}", f"{hand['mfu']:.3f}", own["mfu"] - hand["mfu"],
                  "(difference)", f">= hand-0.01, >= {floor}",
                  met(own["mfu"] >= hand["mfu"] - 0.01 and own["mfu"] >= floor)],
                 [f"1B peak mem MB, compile {key}", f"{own['peak_mem_mb']:.0f}", f"{hand['peak_mem_mb']:.0f}",
                  got["peak_mem_ratio"], "", f"<= {TARGET_MEM}", met(got["peak_mem_ratio"] <= TARGET_MEM)]]
    for variant, result in (parts.get("hosted") or {}).items():
        if "median" not in result:  # skipped, or failed
            rows.append([f"hosted/torchrun {variant}", "-", "-", "-",
                         (result.get("skipped") or result.get("error", ""))[:60], "", ""])
            continue
        step = functools.partial(median_step, result["rounds"])
        if variant == "ladder":
            rows += [["hosted/plain step ms, 1 process", f"{step('launch'):.2f}", f"{step('plain'):.2f}",
                      result["median"], " ".join(f"{x:.3f}" for x in result["ratios"]), f"<= {TARGET_STEP}",
                      met(result["median"] <= TARGET_STEP)],
                     ["bare Ray actor/plain step ms", f"{step('actor'):.2f}", f"{step('plain'):.2f}",
                      result["actor_median"], " ".join(f"{x:.3f}" for x in result["actor_ratios"]), "", ""]]
            continue
        rows.append([f"hosted/torchrun step ms, {variant}", f"{step('launch'):.2f}", f"{step('torchrun'):.2f}",
                     result["median"], " ".join(f"{x:.3f}" for x in result["ratios"]), f"<= {TARGET_STEP}",
                     met(result["median"] <= TARGET_STEP)])
    notes = [f"{head['device']} (driver {head['driver'] or '-'}), torch {head['torch']}, {head['date']}, "
             f"{opts.world} worker(s), {opts.rounds} round(s), {head['elapsed_s']} s in all"
             + (" -- SMOKE: tiny models, figures mean nothing" if opts.smoke else ""),
             "own = raytrainer's loop (hosted: raytrainer launch); base = the hand loop (hosted: torchrun); ratio: "
             "median of the per-round ratios"]
    notes += hosted_cpu_notes(parts) + profile_notes(parts)
    if opts.device != "cuda":
        notes.append(f"CPU: MFU over a nominal {opts.cpu_peak_flops:.0e} FLOP/s, peak memory = the worker "
                     "process's peak RSS (not comparable between runs in one process)")
    common.print_table("raytrainer on a GPU against what a user would otherwise run (reported, not asserted)",
                       ["measure", "own", "base", "ratio", "per round", "target", "met"], rows, notes=notes)


def median_step(rounds: list, launcher: str) -> float:
    return statistics.median(r[launcher]["steady_step_ms"] for r in rounds)


def profile_notes(parts: dict) -> list:
    """One line per profiled side: the device's busy share, the host's waits on it, its busiest host ops."""
    lines = []
    for part in ("own", "hosted"):
        for variant, result in (parts.get(part) or {}).items():
            for name, got in ((result or {}).get("profile") or {}).items():
                if not isinstance(got, dict):  # {"error": ...}: the profiled run failed
                    lines.append(f"profile {part} {variant}: {name} {str(got)[:120]}")
                    continue
                summary = got.get("profile") if part == "hosted" else got
                if not summary:
                    continue
                busy = summary.get("device_busy_share")
                syncs = ", ".join(f"{k} x{v[0]} {v[1]:.1f} ms" for k, v in (summary.get("syncs") or {}).items())
                host = ", ".join(f"{k} {ms:.1f} ms" for k, ms, _ in (summary.get("host_top") or [])[:4])
                lines.append(f"profile {part} {variant} {name}: window {summary['window_ms']:.0f} ms, device busy "
                             f"{'-' if busy is None else f'{busy:.2f}'}; syncs: {syncs or 'none'}; host: {host}")
    return lines


def hosted_cpu_notes(parts: dict) -> list:
    """Per hosted variant and launcher, medians over its rounds: the step's wall time against the CPU its loop's
    thread and its process spent (a gap: the thread waited), the loop thread's context switches a step (blocked:
    on the GIL, a lock or the device; preempted: another thread or process took its core), this driver's CPU and
    the machine's busy cores."""
    lines = []
    for variant, result in (parts.get("hosted") or {}).items():
        for name in ("launch", "torchrun", "plain", "actor"):
            got = [r[name] for r in (result or {}).get("rounds", []) if (r.get(name, {}).get("cpu_per_step") or {})]
            if not got:
                continue
            cpu = {key: statistics.median(g["cpu_per_step"][key] for g in got)
                   for key in ("wall_ms", "loop_thread_cpu_ms", "process_cpu_ms", "loop_thread_blocked",
                               "loop_thread_preempted")}
            driver = statistics.median(g["driver_cpu_s"] for g in got)
            busy = statistics.median(g["machine_busy_cores"] for g in got)
            lines.append(f"cpu {variant} {name}: a step {cpu['wall_ms']:.1f} ms wall, loop thread "
                         f"{cpu['loop_thread_cpu_ms']:.1f} ms CPU, blocked {cpu['loop_thread_blocked']:.1f} and "
                         f"preempted {cpu['loop_thread_preempted']:.1f} times, process {cpu['process_cpu_ms']:.1f} "
                         f"ms CPU; driver {driver:.1f} s CPU, machine {busy:.2f} cores busy over the call")
    return lines


def parse_parts(parser, text: str) -> tuple:
    """--parts "own:ddp,hosted" -> (parts in order, {part: strategies})."""
    wanted, strategies = [], {"own": [], "hosted": []}
    variants = {"own": STRATEGIES, "hosted": HOSTED_VARIANTS}
    for item in (p.strip() for p in text.split(",") if p.strip()):
        name, _, strategy = item.partition(":")
        if name not in PARTS or (strategy and (name not in strategies or strategy not in variants[name])):
            parser.error(f"--parts: unknown {item!r}; of {PARTS}, own optionally :ddp or :fsdp, hosted :ddp, :fsdp "
                         "or :ladder")
        if name not in wanted:
            wanted.append(name)
        if name in strategies:
            strategies[name] += [s for s in ([strategy] if strategy else variants[name]) if s not in strategies[name]]
    return [p for p in PARTS if p in wanted], strategies


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--smoke", action="store_true", help="tiny models, few steps (CI; about a minute on CPU)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds per comparison (default 3; --smoke 1)")
    parser.add_argument("--parts", default=",".join(PARTS),
                        help=f"comma-separated, of {','.join(PARTS)}; own:ddp, hosted:fsdp: one strategy only")
    parser.add_argument("--no-compile", action="store_true", help="the 1B model without torch_compile only")
    parser.add_argument("--profile", choices=("never", "auto", "always"), default=None,
                        help="a torch.profiler summary per side: auto (default; --smoke: never) = where a target is "
                             "missed and time is left")
    parser.add_argument("--budget-s", type=float, default=420.0, help="optional work stops when this runs out")
    parser.add_argument("--cpu-peak-flops", type=float, default=1e11, help="nominal, for the CPU smoke's MFU")
    parser.add_argument("--worker-niceness", type=int, default=None,
                        help="Ray's workers' niceness (RAY_worker_niceness; Ray's default 15), for the Ray this starts")
    parser.add_argument("--switch-interval", type=float, default=None,
                        help="a hosted job's thread switch interval, s (RAYTRAINER_JOB_SWITCH_INTERVAL_S; 0.05)")
    parser.add_argument("--ray-address", default=None,
                        help="join this running Ray instead of starting one (the test suite's, for --smoke)")
    parser.add_argument("--json", default=None)
    opts = parser.parse_args(argv)
    opts.rounds = opts.rounds or (1 if opts.smoke else 3)
    opts.profile = opts.profile or ("never" if opts.smoke else "auto")
    opts.size = "smoke" if opts.smoke or opts.device == "cpu" else "gpu"
    opts.bf16 = opts.device == "cuda"
    opts.world = max(torch.cuda.device_count(), 1) if opts.device == "cuda" else 1
    wanted, opts.strategies = parse_parts(parser, opts.parts)
    clock = Clock(opts.budget_s)
    if opts.worker_niceness is not None:  # read by the raylet this process starts, for every worker
        os.environ["RAY_worker_niceness"] = str(opts.worker_niceness)
    if opts.switch_interval is not None:  # read by raytrainer.worker.hosted in the workers, which inherit it
        os.environ["RAYTRAINER_JOB_SWITCH_INTERVAL_S"] = str(opts.switch_interval)
    common.quiet_ray_logs()
    torch.set_num_threads(1 if opts.device == "cpu" else torch.get_num_threads())
    started = common.start_ray(address=opts.ray_address)
    how = "joined" if opts.ray_address else "started"
    print(f"Ray {how} in {started:.1f} s; parts {wanted}, {opts.world} x {opts.device}, {opts.rounds} round(s)",
          flush=True)
    workdir = tempfile.mkdtemp(prefix="raytrainer-bench-gpu-")
    runners = {"own": part_own, "mfu": part_mfu, "hosted": part_hosted}
    parts = {}
    try:
        for name in wanted:
            t0 = time.time()
            print(f"[{name}] ...", flush=True)
            try:
                parts[name] = runners[name](opts, workdir, clock)
            except Exception as exc:  # one part's failure (an OOM, HF's FSDP) must not lose the others' figures
                parts[name] = {"error": f"{type(exc).__name__}: {exc}"}
                print(f"[{name}] failed: {parts[name]['error'][:400]}", flush=True)
            print(f"[{name}] {time.time() - t0:.0f} s", flush=True)
            write(opts, parts, clock, complete=False)  # what is measured so far survives a run killed later
    finally:
        common.stop_ray()
        shutil.rmtree(workdir, ignore_errors=True)
    head = write(opts, parts, clock, complete=True)
    table(opts, head, parts)
    return 1 if any("error" in part for part in parts.values()) else 0

if __name__ == "__main__":
    sys.exit(main())
