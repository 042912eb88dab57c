"""What checkpoints an output_dir holds: step, committed or partial, size, metrics, best and newest.

Only directories named `checkpoint-<int>` count (the Hugging Face layout), and only committed ones are
ever candidates for resume (`newest_committed`) or for being the newest. A checkpoint with a manifest whose
files no longer match it is *damaged*, not partial: it was committed once, so nothing here deletes it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from ..errors import StorageError
from ..storage import basename, get_fs, join, read_text
from .damage import verify
from .manifest import delete, is_committed, list_files, read_manifest, size_problem

CHECKPOINT_PREFIX = "checkpoint-"
TRAINER_STATE_NAME = "trainer_state.json"
_CHECKPOINT_NAME = re.compile(re.escape(CHECKPOINT_PREFIX) + r"(\d+)$")


def checkpoint_name(step: int) -> str:
    """The directory name of the checkpoint of global step `step` (HF's layout): `checkpoint-{step}`."""
    return f"{CHECKPOINT_PREFIX}{step}"


def step_of_name(name: str) -> int | None:
    """The step of a `checkpoint-N` name; None for any other name."""
    match = _CHECKPOINT_NAME.match(name)
    return int(match.group(1)) if match else None


@dataclass
class CheckpointInfo:
    url: str
    step: int
    committed: bool
    size_bytes: int
    metrics: dict = field(default_factory=dict)
    best: bool = False
    newest: bool = False
    damaged: str | None = None  # committed once, but a file is now missing or has another size: which, and how


def checkpoint_dirs(output_dir: str, storage_options: dict | None = None) -> list[tuple[int, str]]:
    """(step, url) of every `checkpoint-<int>` directory under output_dir, committed or not, by step."""
    fs, path = get_fs(output_dir, storage_options)
    try:
        entries = fs.ls(path, detail=True)
    except FileNotFoundError:
        return []
    if any(e["type"] != "directory" and e["name"].rstrip("/") == path.rstrip("/") for e in entries):
        raise StorageError(f"{output_dir} is a file, not a directory of checkpoints.")
    found = []
    for entry in entries:
        name = basename(entry["name"])
        step = step_of_name(name)
        if entry["type"] == "directory" and step is not None:
            found.append((step, join(output_dir, name)))
    return sorted(found)


def read_trainer_state(ckpt_url: str, storage_options: dict | None = None) -> dict | None:
    """The checkpoint's `trainer_state.json` (HF format), or None when absent or unreadable."""
    try:
        state = json.loads(read_text(join(ckpt_url, TRAINER_STATE_NAME), storage_options))
    except (FileNotFoundError, IsADirectoryError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return state if isinstance(state, dict) else None


def metrics_at(state: dict | None, step: int) -> dict:
    """The last evaluation logged at `step`, merged over the last training log at or before it."""
    history = (state or {}).get("log_history")
    if not isinstance(history, list):
        return {}
    entries = [e for e in history if isinstance(e, dict) and isinstance(e.get("step"), (int, float))]
    evals = [e for e in entries if e["step"] == step and any(str(k).startswith("eval_") for k in e)]
    # A training log carries the loss or learning rate; HF's end-of-training summary (train_runtime, ...)
    # and evaluation entries do not count as one.
    trains = [e for e in entries if e["step"] <= step and ("loss" in e or "learning_rate" in e)
              and not any(str(k).startswith("eval_") for k in e)]
    metrics = {}
    for entry in (trains[-1:] + evals[-1:]):
        metrics.update({k: v for k, v in entry.items() if k != "step"})
    return metrics


def best_checkpoint_name(newest_url: str | None, storage_options: dict | None = None) -> str | None:
    """Basename of `best_model_checkpoint` as recorded by the newest committed checkpoint, if any."""
    if newest_url is None:
        return None
    best = (read_trainer_state(newest_url, storage_options) or {}).get("best_model_checkpoint")
    return basename(best) if isinstance(best, str) and best else None


def list_checkpoints(output_dir: str, storage_options: dict | None = None,
                     checksums: bool = False) -> list[CheckpointInfo]:
    """Every checkpoint-<step> under output_dir: committed, partial (never committed), or damaged (committed,
    but a file is missing or of another size; with `checksums`, also one whose bytes changed: every file of
    every committed checkpoint is read)."""
    infos = []
    for step, url in checkpoint_dirs(output_dir, storage_options):
        files = list_files(url, storage_options)  # one listing gives both the size and the verification
        manifest = read_manifest(url, storage_options)
        problem = size_problem(manifest, files) if manifest is not None else None
        if manifest is not None and problem is None and checksums:
            damage = verify(url, storage_options, manifest)
            problem = (damage.name, damage.problem) if damage is not None else None
        committed = manifest is not None and problem is None
        metrics = metrics_at(read_trainer_state(url, storage_options), step)
        infos.append(CheckpointInfo(url, step, committed, sum(files.values()), metrics,
                                    damaged=f"{problem[0]}: {problem[1]}" if problem else None))
    committed = [info for info in infos if info.committed]
    if committed:
        committed[-1].newest = True
        best = best_checkpoint_name(committed[-1].url, storage_options)
        for info in infos:
            info.best = best is not None and basename(info.url) == best
    return infos


def newest_committed(output_dir: str, storage_options: dict | None = None) -> str | None:
    """URL of the committed checkpoint with the largest step: the one to resume from."""
    for _, url in reversed(checkpoint_dirs(output_dir, storage_options)):
        if is_committed(url, storage_options):
            return url
    return None


def get_last_checkpoint(output_dir: str, storage_options: dict | None = None) -> str | None:
    """transformers' `get_last_checkpoint`, on any fsspec URL (s3://... included) and committed checkpoints only:
    the newest one whose files match its manifest, or None. `resume_from_checkpoint=True` does the same and
    also passes over checksum damage."""
    return newest_committed(output_dir, storage_options)


def remove_partial(output_dir: str, storage_options: dict | None = None) -> list[str]:
    """Delete every checkpoint directory that was never committed (no valid manifest); returns their URLs.

    A damaged committed checkpoint (its manifest is there, a file is truncated or missing) is kept: it may be
    the only copy of its step, and it is the evidence of what went wrong. Only safe while nothing is writing a
    checkpoint (e.g. on resume, before the workers start): a checkpoint being written right now is partial too.
    """
    removed = []
    for _, url in checkpoint_dirs(output_dir, storage_options):
        if read_manifest(url, storage_options) is None:
            delete(url, storage_options)
            removed.append(url)
    return removed
