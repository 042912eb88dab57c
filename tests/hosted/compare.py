"""Compare two result directories written by ``tests/hosted/cases.py``.

``assert_same_runs(dir_a, dir_b, cases)`` asserts, for every case, that

* both runs logged the same number of ``log_history`` entries, at the same
  steps, with the same keys;
* every numeric value in every entry agrees within ``rel`` (relative; values
  whose magnitude is at most ``atol`` are compared absolutely instead, so that
  0.0 vs 1e-9 passes), except the timing keys below;
* ``global_step`` is equal, and the case-specific extras agree: integers
  (the generated token ids in ``seq2seq``'s ``predictions``) exactly, floats
  (``test_metrics``) within ``rel``;
* the final weights (``<case>.safetensors``) have the same tensor names, shapes
  and dtypes, and agree within ``atol`` (absolute, per element).

Keys that are *not* compared, because they measure wall-clock time and so
differ from run to run on the same machine:

* ``*_runtime`` (``train_runtime``, ``eval_runtime``, ``test_runtime``),
* ``*_per_second`` (``train_samples_per_second``, ``eval_steps_per_second`` ...),
* ``*step_time`` (GRPO logs ``step_time``, the seconds one optimizer step took),
* ``wall_time_s`` (the script's own per-case timer, outside ``log_history``).

``total_flos`` *is* compared: it is computed from token counts and parameter
counts (``6 * tokens * params``, summed over processes), not measured, so it is
deterministic for a given model, data and global batch.

Run as a script it prints a table and exits non-zero on any mismatch::

    python tests/hosted/compare.py /tmp/resA /tmp/resB [--cases sft,dpo] [--rel 1e-5] [--atol 1e-6]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import torch
from safetensors.torch import load_file

TIMING_SUFFIXES = ("_runtime", "_per_second", "step_time")
EXTRA_SKIP = {"wall_time_s", "log_history", "torch_threads"}


def is_timing_key(key: str) -> bool:
    return key.endswith(TIMING_SUFFIXES) or key == "wall_time_s"


def available_cases(results_dir: str) -> list[str]:
    return sorted(f[: -len(".json")] for f in os.listdir(results_dir) if f.endswith(".json"))


def load_run(results_dir: str, case: str) -> tuple[dict, dict[str, torch.Tensor]]:
    json_path = os.path.join(results_dir, f"{case}.json")
    weights_path = os.path.join(results_dir, f"{case}.safetensors")
    assert os.path.isfile(json_path), f"[{case}] missing {json_path}"
    assert os.path.isfile(weights_path), f"[{case}] missing {weights_path}"
    with open(json_path) as f:
        result = json.load(f)
    return result, load_file(weights_path)


def _close(a: float, b: float, rel: float, atol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= max(rel * max(abs(a), abs(b)), atol)


def _rel_diff(a: float, b: float) -> float:
    if a == b:
        return 0.0
    return abs(a - b) / max(abs(a), abs(b))


def compare_values(a, b, where: str, rel: float, atol: float, stats: dict) -> None:
    """Recursively compare JSON values; numbers within tolerance, the rest exactly."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None or isinstance(a, str):
        assert a == b, f"{where}: {a!r} != {b!r}"
    elif isinstance(a, int) and isinstance(b, int):
        # token ids (seq2seq predictions), counts: exact
        assert a == b, f"{where}: A={a!r} B={b!r}"
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)):
        a, b = float(a), float(b)
        assert _close(a, b, rel, atol), f"{where}: {a!r} vs {b!r} (rel diff {_rel_diff(a, b):.3g} > {rel:g})"
        if abs(a - b) > 0:
            stats["max_rel"] = max(stats.get("max_rel", 0.0), _rel_diff(a, b))
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            compare_values(x, y, f"{where}[{i}]", rel, atol, stats)
    elif isinstance(a, dict) and isinstance(b, dict):
        keys_a = {k for k in a if not is_timing_key(k)}
        keys_b = {k for k in b if not is_timing_key(k)}
        assert keys_a == keys_b, (
            f"{where}: keys differ: only in A {sorted(keys_a - keys_b)}, only in B {sorted(keys_b - keys_a)}"
        )
        for k in sorted(keys_a):
            compare_values(a[k], b[k], f"{where}.{k}", rel, atol, stats)
    else:
        raise AssertionError(f"{where}: type {type(a).__name__} != {type(b).__name__} ({a!r} vs {b!r})")


def compare_case(dir_a: str, dir_b: str, case: str, rel: float = 1e-5, atol: float = 1e-6) -> dict:
    """Assert one case is the same in both dirs; return a summary for the table."""
    res_a, w_a = load_run(dir_a, case)
    res_b, w_b = load_run(dir_b, case)
    stats: dict = {"case": case, "entries": 0, "max_rel": 0.0, "max_abs_w": 0.0, "tensors": len(w_a)}

    # --- log_history -------------------------------------------------------
    hist_a, hist_b = res_a["log_history"], res_b["log_history"]
    assert len(hist_a) == len(hist_b), (
        f"[{case}] log_history has {len(hist_a)} entries in A but {len(hist_b)} in B; "
        f"steps A={[e.get('step') for e in hist_a]} B={[e.get('step') for e in hist_b]}"
    )
    for i, (ea, eb) in enumerate(zip(hist_a, hist_b)):
        step = ea.get("step")
        assert step == eb.get("step"), f"[{case}] log_history[{i}]: step {step} in A but {eb.get('step')} in B"
        keys_a = {k for k in ea if not is_timing_key(k)}
        keys_b = {k for k in eb if not is_timing_key(k)}
        assert keys_a == keys_b, (
            f"[{case}] step {step} (log_history[{i}]): keys only in A {sorted(keys_a - keys_b)}, "
            f"only in B {sorted(keys_b - keys_a)}"
        )
        for key in sorted(keys_a):
            va, vb = ea[key], eb[key]
            where = f"[{case}] step {step} (log_history[{i}]) key {key!r}"
            if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and not isinstance(va, bool):
                assert _close(float(va), float(vb), rel, atol), (
                    f"{where}: A={va!r} B={vb!r} (rel diff {_rel_diff(float(va), float(vb)):.3g} > {rel:g})"
                )
                stats["max_rel"] = max(stats["max_rel"], _rel_diff(float(va), float(vb)))
            else:
                compare_values(va, vb, where, rel, atol, stats)
    stats["entries"] = len(hist_a)

    # --- global_step and extras ---------------------------------------------
    assert res_a.get("global_step") == res_b.get("global_step"), (
        f"[{case}] global_step A={res_a.get('global_step')} B={res_b.get('global_step')}"
    )
    # Where both sides recorded their torch thread count (cases.py does; the Python API's driver-side view does
    # not), a difference is named first: it rounds some operations differently, and would show as a weight off in
    # its last digits.
    threads = res_a.get("torch_threads"), res_b.get("torch_threads")
    assert None in threads or threads[0] == threads[1], (
        f"[{case}] ran at {threads[0]} torch thread(s) in A and {threads[1]} in B: compare at the same count")
    extra_keys = (set(res_a) | set(res_b)) - EXTRA_SKIP
    for key in sorted(extra_keys):
        assert key in res_a and key in res_b, f"[{case}] result key {key!r} only in {'A' if key in res_a else 'B'}"
        compare_values(res_a[key], res_b[key], f"[{case}] {key}", rel, atol, stats)

    # --- final weights -----------------------------------------------------
    assert set(w_a) == set(w_b), (
        f"[{case}] weight names differ: only in A {sorted(set(w_a) - set(w_b))}, "
        f"only in B {sorted(set(w_b) - set(w_a))}"
    )
    for name in sorted(w_a):
        ta, tb = w_a[name], w_b[name]
        assert ta.shape == tb.shape and ta.dtype == tb.dtype, (
            f"[{case}] weight {name}: A {tuple(ta.shape)} {ta.dtype} vs B {tuple(tb.shape)} {tb.dtype}"
        )
        if ta.numel() == 0:
            continue
        diff = (ta.double() - tb.double()).abs()
        max_abs = diff.max().item()
        if max_abs > atol or not torch.isfinite(diff).all():
            idx = tuple(int(i) for i in torch.unravel_index(diff.argmax(), diff.shape))
            raise AssertionError(
                f"[{case}] final weight {name} differs: max |A-B| = {max_abs:.3g} > atol {atol:g} "
                f"at {idx}: A={ta[idx].item()!r} B={tb[idx].item()!r}"
            )
        stats["max_abs_w"] = max(stats["max_abs_w"], max_abs)
    return stats


def assert_same_runs(dir_a: str, dir_b: str, cases, rel: float = 1e-5, atol: float = 1e-6) -> list[dict]:
    """Assert every case in ``cases`` ran the same in ``dir_a`` and ``dir_b``."""
    if isinstance(cases, str):
        cases = [c for c in cases.split(",") if c]
    return [compare_case(dir_a, dir_b, case, rel=rel, atol=atol) for case in cases]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Compare two tests/hosted/cases.py result dirs.")
    parser.add_argument("dir_a")
    parser.add_argument("dir_b")
    parser.add_argument("--cases", default=None, help="comma list (default: every <case>.json in dir_a)")
    parser.add_argument("--rel", type=float, default=1e-5)
    parser.add_argument("--atol", type=float, default=1e-6)
    opts = parser.parse_args(argv)
    cases = opts.cases.split(",") if opts.cases else available_cases(opts.dir_a)

    header = f"{'case':<18} {'entries':>7} {'tensors':>7} {'max rel (logs)':>15} {'max |dW|':>10}  result"
    print(header)
    print("-" * len(header))
    failures = 0
    for case in cases:
        try:
            s = compare_case(opts.dir_a, opts.dir_b, case, rel=opts.rel, atol=opts.atol)
            print(f"{case:<18} {s['entries']:>7} {s['tensors']:>7} {s['max_rel']:>15.3g} {s['max_abs_w']:>10.3g}  ok")
        except AssertionError as e:
            failures += 1
            print(f"{case:<18} {'':>7} {'':>7} {'':>15} {'':>10}  FAIL: {e}")
    print(f"{len(cases) - failures}/{len(cases)} cases match")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
