"""Checkpoint costs of raytrainer: save throughput, training stall per save, recovery after a lost worker.

    python benchmarks/checkpoint.py                # ~8-10 min on a 2-core machine (stall: DDP and FSDP)
    python benchmarks/checkpoint.py --quick        # ~1.5-2 min
    python benchmarks/checkpoint.py --s3 --json /tmp/checkpoint.json

(i) save throughput: `raytrainer.checkpoint.writer.write_snapshot` (serialise every file, write it, commit
    the manifest) of a Snapshot of an --size-mb model plus its AdamW state, as bytes/s, against a plain
    fsspec write (`fs.open(path, "wb").write(data)`) of the very same file contents (same names, same total
    size) into a fresh directory. Local tmp dir, and with --s3 a moto server on 127.0.0.1 started here.
    Target: ratio >= 0.9. Page cache state is evened out with os.sync() before every timed write.
(ii) training stall per save: the Trainer (num_workers=0, and 2 unless --quick; strategy ddp and fsdp, see
    --stall-strategies) with save_async=True vs False,
    saving every --save-every steps. Per-step start times come from a `training_step` override; a save
    happens between the starts of steps k and k+1 when (k+1) % save_every == 0. Stall per save = the extra
    time of the steps from a save to the next one over the run's quiet step time (median of the second
    half of those intervals), median over the saves: everything a save costs the loop, including slower
    steps while a background write runs. Cross-checked against a run that never saves.
    Target: stall_async / stall_sync <= 0.1, for DDP and for FSDP.
(iii) recovery: a 2-worker run with max_failures=1 in which rank 1 calls os._exit(1) at --kill-step (once: a
    marker file; and only after the checkpoint it should resume from is committed). Recovery time = from
    the timestamp written just before os._exit to the start of the first step of the restarted worker group.

Figures are reported, never asserted.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import common  # noqa: E402
from common import MLP, SyntheticDataset, num_params, print_table, read_stamps  # noqa: E402

SAVE_TARGET = 0.9
STALL_TARGET = 0.1


# ----------------------------------------------------------------------------------- (i) save throughput
def big_model(size_mb: float) -> nn.Module:
    """Square 1024x1024 linear layers (4 MiB each in float32) adding up to about size_mb MiB."""
    layers = max(1, round(size_mb / 4))
    return nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(layers)])


def build_snapshot(model: nn.Module, with_optimizer: bool):
    from raytrainer import TrainingArguments
    from raytrainer.checkpoint.snapshot import Snapshot, get_rng_state, to_host
    from raytrainer.state import TrainerState

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    if with_optimizer:
        for p in model.parameters():
            p.grad = torch.randn_like(p)
        optimizer.step()  # populates exp_avg / exp_avg_sq: the optimizer file is twice the model
    t0 = time.perf_counter()
    snapshot = Snapshot(step=1, model_state=to_host(model.state_dict()), model=model,
                        optimizer_state=to_host(optimizer.state_dict()) if with_optimizer else None,
                        scheduler_state=scheduler.state_dict() if with_optimizer else None,
                        rng_states=[get_rng_state()] if with_optimizer else [],
                        trainer_state_json=TrainerState(global_step=1).to_json_string(),
                        args_json=TrainingArguments(output_dir="/tmp/unused").to_json_string())
    return snapshot, time.perf_counter() - t0


def _fs(url: str, opts):
    from raytrainer.storage import get_fs

    return get_fs(url, opts)


def plain_write(files: dict, base_url: str, opts) -> float:
    """The baseline: fsspec writes of the same bytes, file by file, no serialisation, no manifest."""
    fs, base = _fs(base_url, opts)
    t0 = time.perf_counter()
    if not base_url.startswith("s3://"):
        fs.makedirs(base, exist_ok=True)
    for name, data in files.items():
        with fs.open(f"{base.rstrip('/')}/{name}", "wb") as f:
            f.write(data)
    return time.perf_counter() - t0


def direct_write(snapshot, directory: str) -> float:
    """What a hand-written (HF-style) save does locally: serialise each object straight into its file."""
    import safetensors.torch

    from raytrainer.checkpoint.snapshot import ARGS_FILE, OPTIMIZER_FILE, SCHEDULER_FILE, TRAINER_STATE_FILE, rng_file

    t0 = time.perf_counter()
    os.makedirs(directory, exist_ok=True)
    safetensors.torch.save_file(snapshot.model_state, os.path.join(directory, "model.safetensors"),
                                metadata={"format": "pt"})
    if snapshot.optimizer_state is not None:
        torch.save(snapshot.optimizer_state, os.path.join(directory, OPTIMIZER_FILE))
        torch.save(snapshot.scheduler_state, os.path.join(directory, SCHEDULER_FILE))
    for rank, rng in enumerate(snapshot.rng_states):
        torch.save(rng, os.path.join(directory, rng_file(rank)))
    for name, text in ((TRAINER_STATE_FILE, snapshot.trainer_state_json), (ARGS_FILE, snapshot.args_json)):
        with open(os.path.join(directory, name), "w") as f:
            f.write(text)
    return time.perf_counter() - t0


def rt_write(snapshot, model, url: str, opts) -> tuple:
    from raytrainer.checkpoint.model_io import save_model_files
    from raytrainer.checkpoint.writer import write_snapshot

    t0 = time.perf_counter()
    manifest = write_snapshot(snapshot, url, lambda d, sd: save_model_files(model, d, sd), opts)
    return time.perf_counter() - t0, manifest


def _remove(url: str, opts):
    from raytrainer.storage import remove

    remove(url, recursive=True, storage_options=opts)


def bench_save(size_mb: float, repeats: int, with_optimizer: bool, targets: list) -> dict:
    """targets: [(label, base_url, storage_options)]. Each repeat writes raytrainer then plain, alternating."""
    model = big_model(size_mb)
    snapshot, capture_s = build_snapshot(model, with_optimizer)
    scratch = tempfile.mkdtemp(prefix="raytrainer-bench-ckpt-contents-")
    try:
        manifest = rt_write(snapshot, model, os.path.join(scratch, "ref"), None)[1]
        files = {}
        for name in manifest["files"]:
            with open(os.path.join(scratch, "ref", name), "rb") as f:
                files[name] = f.read()
        files["COMMITTED"] = open(os.path.join(scratch, "ref", "COMMITTED"), "rb").read()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    total = sum(len(b) for b in files.values())
    serialise_s = _serialise_only(snapshot)
    out = {"serialise_only_s": serialise_s, "model_params": num_params(model), "bytes": total,
           "files": {k: len(v) for k, v in files.items()}, "capture_s": capture_s, "targets": {}}
    for label, base_url, opts in targets:
        local = opts is None
        kinds = ("rt", "plain", "direct") if local else ("rt", "plain")
        times = {k: [] for k in kinds}
        for i in range(repeats):
            for kind in kinds if i % 2 == 0 else tuple(reversed(kinds)):
                url = f"{base_url.rstrip('/')}/{kind}-{i}-{uuid.uuid4().hex[:6]}"
                os.sync()
                if kind == "rt":
                    times[kind].append(rt_write(snapshot, model, url, opts)[0])
                elif kind == "plain":
                    times[kind].append(plain_write(files, url, opts))
                else:
                    times[kind].append(direct_write(snapshot, url))
                _remove(url, opts)
        med = {k: statistics.median(v) for k, v in times.items()}
        out["targets"][label] = {"raytrainer_s": med["rt"], "plain_s": med["plain"], "all_s": times,
                                 "raytrainer_MBps": total / med["rt"] / 2**20,
                                 "plain_MBps": total / med["plain"] / 2**20, "ratio": med["plain"] / med["rt"]}
        if "direct" in med:
            out["targets"][label].update(direct_s=med["direct"], direct_MBps=total / med["direct"] / 2**20,
                                         ratio_vs_direct=med["direct"] / med["rt"])
        print(f"    {label}: " + ", ".join(f"{k} {total / v / 2**20:.0f} MiB/s" for k, v in med.items()), flush=True)
    return out


def _serialise_only(snapshot, repeats: int = 3) -> float:
    """Seconds (median) to turn the snapshot into bytes in memory, in the writer's formats (no I/O)."""
    import safetensors.torch

    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        safetensors.torch.save(snapshot.model_state)
        for obj in (snapshot.optimizer_state, snapshot.scheduler_state, *snapshot.rng_states):
            torch.save(obj, io.BytesIO())
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def start_s3():
    sys.path.insert(0, common.REPO_ROOT)
    from tests import s3server  # the repo's helper: moto on a free loopback port

    server = s3server.start()
    return server, s3server.create_bucket(server)


# ----------------------------------------------------------------------------------- (ii) stall per save
def stall_model_cfg(size_mb: float) -> dict:
    """An MLP of about size_mb MiB of float32 parameters: dim 1024, hidden chosen to fit."""
    hidden = max(256, int((size_mb * 2**20 / 4 / 2) ** 0.5))  # two hidden x hidden layers dominate
    return {"dim": 512, "hidden": hidden, "depth": 3, "num_classes": 16}


def run_stall(workdir: str, num_workers: int, mode: str, steps: int, save_every: int, mcfg: dict,
              batch: int, strategy: str = "ddp") -> dict:
    """mode: 'none' (no saving), 'sync' (save_async=False) or 'async' (save_async=True). strategy 'fsdp':
    every Linear is a block; the checkpoint is sharded (DCP), written by every rank."""
    import raytrainer

    timed = common.make_timed_trainer_class()
    tag = f"{mode}-{strategy}-nw{num_workers}-{uuid.uuid4().hex[:6]}"
    stamp_dir = os.path.join(workdir, f"stamps-{tag}")
    os.makedirs(stamp_dir)
    args = raytrainer.TrainingArguments(
        output_dir=os.path.join(workdir, f"out-{tag}"), num_workers=num_workers, max_steps=steps,
        per_device_train_batch_size=batch, learning_rate=1e-3, optim="adamw_torch",
        save_strategy="no" if mode == "none" else "steps", save_steps=save_every, save_total_limit=2,
        save_async=(mode == "async"), logging_steps=10_000, disable_tqdm=True, seed=0, strategy=strategy,
        **({"fsdp_config": {"transformer_layer_cls_to_wrap": ["Linear"]}} if strategy == "fsdp" else {}))
    torch.manual_seed(0)
    trainer = timed(model=MLP(**mcfg), args=args,
                    train_dataset=SyntheticDataset(batch * max(num_workers, 1) * 16, mcfg["dim"], mcfg["num_classes"]))
    trainer.stamp_dir = stamp_dir
    trainer.pop_callback(raytrainer.PrinterCallback)
    t0 = time.time()
    trainer.train()
    total = time.time() - t0
    stamps = read_stamps(os.path.join(stamp_dir, os.listdir(stamp_dir)[0]))
    shutil.rmtree(os.path.join(workdir, f"out-{tag}"), ignore_errors=True)
    perf, step_ids = stamps["perf"], stamps["steps"]
    durations = [b - a for a, b in zip(perf, perf[1:])]
    saving = [mode != "none" and (s + 1) % save_every == 0 for s in step_ids[:-1]]
    return {"durations": durations, "saving": saving, "total_s": total}


def stall_figures(run: dict, save_every: int, none: dict = None) -> dict:
    """Stall of the saves of one run. A window is a save step and the steps up to the next save; its stall
    is the sum of its step durations minus as many quiet steps, where quiet = the median of the second half
    of every window (the same run, so slow drifts in machine load cancel). Median over windows: one window
    hit by a burst of outside load does not decide the figure."""
    durs, saves = run["durations"], run["saving"]
    starts = [i for i, s in enumerate(saves) if s and i + save_every <= len(durs)]
    windows = [durs[i:i + save_every] for i in starts]
    quiet = statistics.median([d for w in windows for d in w[save_every // 2:]])
    out = {"n_windows": len(windows), "quiet_step_ms": 1e3 * quiet,
           "stall_per_save_ms": 1e3 * statistics.median(sum(d - quiet for d in w) for w in windows),
           "stall_mean_ms": 1e3 * statistics.fmean(sum(d - quiet for d in w) for w in windows),
           "save_step_excess_ms": 1e3 * (statistics.median(w[0] for w in windows) - quiet),
           "window_stalls_ms": [1e3 * sum(d - quiet for d in w) for w in windows]}
    if none is not None:  # cross-check against a run that never saves
        base = statistics.median(none["durations"][save_every - 1:])
        out["no_save_step_ms"] = 1e3 * base
        out["stall_vs_no_save_run_ms"] = 1e3 * sum(sum(w) - len(w) * base for w in windows) / len(windows)
    return out


def bench_stall(workdir: str, num_workers: int, steps: int, save_every: int, size_mb: float, batch: int,
                repeats: int, strategy: str = "ddp") -> dict:
    mcfg = stall_model_cfg(size_mb)
    per_round = []
    for r in range(repeats):
        runs = {}
        modes = ("none", "sync", "async") if r == 0 else (("async", "sync") if r % 2 else ("sync", "async"))
        for mode in modes:  # one no-save run per setting, for the cross-check
            print(f"    stall {strategy} nw={num_workers} round {r + 1}/{repeats}: {mode} ...", flush=True)
            runs[mode] = run_stall(workdir, num_workers, mode, steps, save_every, mcfg, batch, strategy)
        if r == 0:
            none = runs["none"]
        per_round.append({m: stall_figures(runs[m], save_every, none) for m in ("sync", "async")})

    def med(mode, key):
        values = [rd[mode][key] for rd in per_round if rd[mode].get(key) is not None]
        return statistics.median(values) if values else None

    sync, asyn = med("sync", "stall_per_save_ms"), med("async", "stall_per_save_ms")
    vs_none = {m: med(m, "stall_vs_no_save_run_ms") for m in ("sync", "async")}
    return {"num_workers": num_workers, "strategy": strategy, "model": mcfg,
            "model_MiB": num_params(MLP(**mcfg)) * 4 / 2**20,
            "steps": steps, "save_every": save_every, "rounds": per_round,
            "quiet_step_ms": med("sync", "quiet_step_ms"), "stall_sync_ms": sync, "stall_async_ms": asyn,
            "stall_mean_sync_ms": med("sync", "stall_mean_ms"), "stall_mean_async_ms": med("async", "stall_mean_ms"),
            "ratio_mean_based": (med("async", "stall_mean_ms") / med("sync", "stall_mean_ms")
                                 if med("sync", "stall_mean_ms") else None),
            "save_step_excess_sync_ms": med("sync", "save_step_excess_ms"),
            "save_step_excess_async_ms": med("async", "save_step_excess_ms"),
            "stall_vs_no_save_sync_ms": vs_none["sync"], "stall_vs_no_save_async_ms": vs_none["async"],
            "ratio": asyn / sync if sync and sync > 0 else None}


# -------------------------------------------------------------------------------------- (iii) recovery
def bench_recovery(workdir: str, steps: int, save_every: int, kill_step: int) -> dict:
    import raytrainer

    timed = common.make_timed_trainer_class()
    stamp_dir = os.path.join(workdir, "recovery-stamps")
    out = os.path.join(workdir, "recovery-out")
    os.makedirs(stamp_dir)
    resume_step = (kill_step // save_every) * save_every
    args = raytrainer.TrainingArguments(
        output_dir=out, num_workers=2, max_failures=1, max_steps=steps, per_device_train_batch_size=32,
        learning_rate=1e-3, optim="adamw_torch", save_strategy="steps", save_steps=save_every, logging_steps=10_000,
        disable_tqdm=True, seed=0)
    mcfg = {"dim": 256, "hidden": 512, "depth": 3, "num_classes": 16}
    torch.manual_seed(0)
    trainer = timed(model=MLP(**mcfg), args=args, train_dataset=SyntheticDataset(4096, 256, 16))
    trainer.stamp_dir = stamp_dir
    marker = os.path.join(workdir, "killed.json")
    trainer.kill = {"rank": 1, "step": kill_step, "marker": marker,
                    "wait_for": os.path.join(out, f"checkpoint-{resume_step}", "COMMITTED")}
    trainer.pop_callback(raytrainer.PrinterCallback)
    t0 = time.time()
    output = trainer.train()
    total = time.time() - t0
    with open(marker) as f:
        killed = json.load(f)
    attempts = [read_stamps(os.path.join(stamp_dir, n)) for n in os.listdir(stamp_dir) if n.startswith("rank0-")]
    restarted = [a for a in attempts if a["restarted"]]
    if not restarted:
        raise RuntimeError(f"no restarted attempt recorded (stamps: {os.listdir(stamp_dir)})")
    first = min(restarted, key=lambda a: a["wall"][0])
    return {"kill_step": killed["step"], "resumed_at_step": first["steps"][0],
            "steps_redone": killed["step"] - first["steps"][0],
            "recovery_s": first["wall"][0] - killed["time"],
            "to_worker_code_s": (first["entered"] - killed["time"]) if first.get("entered") else None,
            "worker_setup_s": (first["wall"][0] - first["entered"]) if first.get("entered") else None,
            "restarts_in_state": len(trainer.state.restarts), "final_step": output.global_step,
            "run_total_s": total}


# ------------------------------------------------------------------------------------------------- main
def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="smaller model, fewer repeats, stall with num_workers=0 only (about 1.5-2 min)")
    parser.add_argument("--size-mb", type=float, default=None, help="(i) model size in MiB (default 128, quick 64)")
    parser.add_argument("--model-only", action="store_true", help="(i) no optimizer/scheduler/RNG in the snapshot")
    parser.add_argument("--save-repeats", type=int, default=None, help="(i) writes per kind (default 4, quick 2)")
    parser.add_argument("--s3", action="store_true", help="(i) also against a moto S3 server on 127.0.0.1")
    parser.add_argument("--steps", type=int, default=None, help="(ii) steps per run (default 60, quick 50)")
    parser.add_argument("--save-every", type=int, default=10, help="(ii) save every N steps")
    parser.add_argument("--stall-size-mb", type=float, default=None, help="(ii) model MiB (default 32, quick 24)")
    parser.add_argument("--stall-batch", type=int, default=16, help="(ii) per-worker batch")
    parser.add_argument("--stall-workers", default=None, help="(ii) comma list of num_workers (default 0,2; quick 0)")
    parser.add_argument("--stall-strategies", default="ddp,fsdp", help="(ii) comma list: ddp, fsdp")
    parser.add_argument("--stall-repeats", type=int, default=None,
                        help="(ii) rounds (default 2 for num_workers=0 and 1 for 2; quick 1)")
    parser.add_argument("--kill-step", type=int, default=12, help="(iii) global step at which rank 1 dies")
    parser.add_argument("--skip", default="", help="comma list of parts to skip: save,stall,recovery")
    parser.add_argument("--json", default=None, help="write the results here as JSON")
    opts = parser.parse_args(argv)
    q = opts.quick
    size_mb = opts.size_mb or (64 if q else 128)
    save_repeats = opts.save_repeats or (2 if q else 4)
    steps = opts.steps or (50 if q else 60)
    stall_mb = opts.stall_size_mb or (24 if q else 32)
    stall_workers = [int(w) for w in (opts.stall_workers or ("0" if q else "0,2")).split(",") if w != ""]
    stall_repeats = opts.stall_repeats or (1 if q else 2)
    skip = set(filter(None, opts.skip.split(",")))

    common.ship_by_value()
    common.quiet_ray_logs()
    torch.set_num_threads(1)  # in-process training (num_workers=0) gets one thread, like each worker
    results = {"config": {k: v for k, v in vars(opts).items()}, "machine": common.machine_info()}
    workdir = tempfile.mkdtemp(prefix="raytrainer-bench-ckpt-")
    server = None
    try:
        if "save" not in skip:
            print(f"(i) save throughput: {size_mb:g} MiB model{'' if opts.model_only else ' + AdamW state'}, "
                  f"{save_repeats} writes each ...", flush=True)
            targets = [("local", os.path.join(workdir, "save"), None)]
            if opts.s3:
                server, bucket = start_s3()
                targets.append(("s3 (moto)", f"{bucket}/save", server.storage_options))
            results["save"] = bench_save(size_mb, save_repeats, not opts.model_only, targets)
        if "stall" not in skip:
            results["stall"] = []
            for nw, strategy in [(nw, st) for nw in stall_workers for st in opts.stall_strategies.split(",")]:
                if nw > 0:
                    import ray

                    if not ray.is_initialized():
                        results["ray_init_s"] = common.start_ray()
                print(f"(ii) stall per save: {strategy}, num_workers={nw}, {steps} steps, save every "
                      f"{opts.save_every} ...", flush=True)
                results["stall"].append(bench_stall(workdir, nw, steps, opts.save_every, stall_mb, opts.stall_batch,
                                                    stall_repeats if nw == 0 or opts.stall_repeats else 1, strategy))
        if "recovery" not in skip:
            import ray

            if not ray.is_initialized():
                results["ray_init_s"] = common.start_ray()
            print(f"(iii) recovery: 2 workers, rank 1 exits at step {opts.kill_step} ...", flush=True)
            results["recovery"] = bench_recovery(workdir, max(30, opts.kill_step + 10), 5, opts.kill_step)
    finally:
        common.stop_ray()
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    report(results)
    common.write_json(opts.json, {"benchmark": "checkpoint", **results})


def report(results: dict):
    rows = []
    save = results.get("save")
    if save:
        mib = save["bytes"] / 2**20
        for label, t in save["targets"].items():
            rows.append([f"(i) save throughput, {label}", f"{t['raytrainer_MBps']:.0f} MiB/s",
                         f"{t['plain_MBps']:.0f} MiB/s (plain fsspec)", t["ratio"], f">= {SAVE_TARGET}",
                         "yes" if t["ratio"] >= SAVE_TARGET else "NO",
                         f"{mib:.0f} MiB in {len(save['files'])} files; {t['raytrainer_s']:.2f} s vs "
                         f"{t['plain_s']:.2f} s (median)"])
            if "direct_s" in t:
                rows.append([f"(i) save throughput, {label}, vs direct", f"{t['raytrainer_MBps']:.0f} MiB/s",
                             f"{t['direct_MBps']:.0f} MiB/s (HF-style direct)", t["ratio_vs_direct"], "info", "-",
                             "safetensors.save_file + torch.save(obj, file) per file: serialisation included"])
        rows.append(["(i) serialise only (no I/O)", f"{save['serialise_only_s']:.3f} s", "-", None, "info", "-",
                     "safetensors.save + torch.save of the state in memory = "
                     f"{save['bytes'] / 2**20 / save['serialise_only_s']:.0f} MiB/s"])
        rows.append(["(i) capture (to_host) before a save", f"{save['capture_s']:.3f} s", "-", None, "info", "-",
                     "the part that always blocks training"])
    for st in results.get("stall", []):
        nw = st["num_workers"]

        def ratio(x, y):
            return x / y if x is not None and y else None

        rows.append([f"(ii) stall per save, {st.get('strategy', 'ddp')}, num_workers={nw}",
                     f"async {st['stall_async_ms']:.0f} ms",
                     f"sync {st['stall_sync_ms']:.0f} ms", st["ratio"], f"<= {STALL_TARGET}",
                     ("yes" if st["ratio"] <= STALL_TARGET else "NO") if st["ratio"] is not None else "-",
                     f"median over saves; {st['model_MiB']:.0f} MiB model + AdamW state, quiet step "
                     f"{st['quiet_step_ms']:.0f} ms, a save every {st['save_every']} steps"])
        rows.append(["    same, mean over saves", f"async {st['stall_mean_async_ms']:.0f} ms",
                     f"sync {st['stall_mean_sync_ms']:.0f} ms", st["ratio_mean_based"], "info", "-",
                     "one burst of outside load in one interval weighs in here"])
        rows.append(["    the saving step alone", f"async {st['save_step_excess_async_ms']:.0f} ms",
                     f"sync {st['save_step_excess_sync_ms']:.0f} ms",
                     ratio(st["save_step_excess_async_ms"], st["save_step_excess_sync_ms"]), "info", "-",
                     "async: capture (to_host) + handing over; the rest is the following steps' slow-down"])
        rows.append(["    vs a run that never saves", f"async {st['stall_vs_no_save_async_ms']:.0f} ms",
                     f"sync {st['stall_vs_no_save_sync_ms']:.0f} ms",
                     ratio(st["stall_vs_no_save_async_ms"], st["stall_vs_no_save_sync_ms"]), "info", "-",
                     "cross-check; another run, so machine load differs"])
    rec = results.get("recovery")
    if rec:
        rows.append(["(iii) recovery: kill -> first step after resume", f"{rec['recovery_s']:.1f} s", "-", None,
                     "info", "-",
                     f"to worker code {rec['to_worker_code_s']:.1f} s + set-up {rec['worker_setup_s']:.1f} s; "
                     f"killed at step {rec['kill_step']}, resumed at {rec['resumed_at_step']}, finished at "
                     f"{rec['final_step']}, restarts recorded {rec['restarts_in_state']}"])
    if results.get("ray_init_s") is not None:
        rows.append(["Ray start (ray.init), not in the figures", f"{results['ray_init_s']:.1f} s", "-", None, "info",
                     "-", ""])
    print_table("Checkpoint benchmark (ratios reported, not asserted)",
                ["measure", "raytrainer", "baseline", "ratio", "target", "met", "details"], rows,
                notes=["(i) ratio = raytrainer bytes/s / plain fsspec bytes/s of the same file contents",
                       "(ii) ratio = stall_async / stall_sync; stall per save = median over saves of the extra time "
                       "of the steps from that save to the next one, over the run's quiet step time (second half of "
                       "each interval); 'save step alone' counts only the step that saves; 'vs no-save run' is the "
                       "same extra time measured against a run that never saves (noisier: a different run)"])


if __name__ == "__main__":
    main()
