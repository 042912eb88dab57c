"""The one choice of the checkpoint a training resumes from: the driver's resume, a worker group's restart and the
hosted mode's claim all call `choose`, each with its filters.

- A named checkpoint (`named`): that one, committed and intact, or an error naming the fix; never another.
- Otherwise the newest committed checkpoint that passes the filters and whose every file matches its manifest
  (sizes, then checksums: damage that kept a file's size is passed over here, not found at load). The filters:
  this run's (`run_id`: a restart continues this run, never an earlier run's longer history), this trainer
  class's (`trainer`, from the manifest's `written_by`), and where several Trainers of that class wrote the
  output_dir, the one at `index` among the script's Trainers.
- A damaged checkpoint is passed over, said on the console and left in place as evidence (damage.py); an
  unfinished one (no manifest: a write that never ended) is removed first when `remove_unfinished`, and said.

Newest is the highest step, or with `by_commit_time` the last committed (the hosted mode: a run started afresh
writes lower steps after a longer earlier run's). By step the candidates are read lazily, newest first: a resume
reads the manifests and trainer states down to the one it takes, not the whole output_dir's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

from ..errors import ConfigError
from ..state import OWN_STATE_KEY
from ..storage import absolute_if_local, basename, exists, is_local, join, read_bytes
from ..storage.retry import Retry
from ..verbosity import notice
from .damage import CheckpointDamagedError, parsing, verify
from .listing import TRAINER_STATE_NAME, checkpoint_dirs, remove_partial
from .manifest import commit_order, read_manifest

# The trainer a checkpoint without `written_by` is counted as: raytrainer's own loop writes none.
OWN_TRAINER = "raytrainer.Trainer"


@dataclass(frozen=True)
class Choice:
    """What `choose` found: the checkpoint (None: none fits) and why the newer ones were not taken."""

    url: Optional[str] = None
    step: Optional[int] = None
    damaged: tuple = ()  # CheckpointDamagedError of each newer candidate passed over, newest first
    others_only: tuple = ()  # the trainers that wrote the committed checkpoints here, when none passed the filters

    def passed_over(self) -> str:
        """The damaged checkpoints passed over, by name, file and problem: the one wording of every caller."""
        return ("passed over " + "; ".join(f"{basename(d.ckpt_url)} ({d.name}: {d.problem})" for d in self.damaged)
                + ": damaged, left in place")


@dataclass(frozen=True)
class _Candidate:
    url: str
    step: int
    manifest: dict
    damage: Optional[CheckpointDamagedError] = None  # found before its files were read: whose it is is unknown


def choose(output_dir: str, storage_options: Optional[dict] = None, *, named: Optional[str] = None,
           run_id: Optional[str] = None, trainer: Optional[str] = None, index: Optional[int] = None,
           by_commit_time: bool = False, remove_unfinished: bool = False, retry: Optional[Retry] = None,
           doing: str = "resuming", quiet_if_clean: bool = False, hf_folders: bool = False) -> Choice:
    """The checkpoint to resume from (module docstring). `retry` wraps each storage call (a worker waits out a
    transient error). The choice is said as "{doing} from checkpoint-N (step N) under output_dir", with the
    damage passed over (`quiet_if_clean`: only when there was some). `hf_folders`: a named local folder without a
    manifest (written by HF alone) is taken as it is."""
    call = retry.call if retry is not None else (lambda fn, url, what: fn())
    if named is not None:
        return Choice(url=_named(named, storage_options, hf_folders))
    if remove_unfinished:
        removed = call(lambda: remove_partial(output_dir, storage_options), output_dir,
                       "removing unfinished checkpoints")
        if removed:
            notice(f"removed {len(removed)} unfinished checkpoint(s) under {output_dir}: "
                   + ", ".join(basename(r) for r in removed))
    tally = _Tally()
    found = _candidates(output_dir, storage_options, call, run_id, trainer, tally)
    if by_commit_time or index is not None:
        found = _newest_first(list(found), index, by_commit_time)
    damaged = []
    for candidate in found:
        damage = candidate.damage or call(lambda c=candidate: verify(c.url, storage_options, c.manifest),
                                          candidate.url, "verifying checksums")
        if damage is not None:
            damaged.append(damage)
            continue
        choice = Choice(candidate.url, candidate.step, tuple(damaged))
        if damaged or not quiet_if_clean:
            notice(f"{doing} from {basename(choice.url)} (step {choice.step}) under {output_dir}"
                   + (f"; {choice.passed_over()}" if damaged else ""))
        return choice
    return Choice(damaged=tuple(damaged), others_only=() if tally.matched else tuple(sorted(tally.others)))


@dataclass
class _Tally:
    """Kept while the candidates are read: the trainers filtered out, and whether any checkpoint passed."""

    others: set = field(default_factory=set)
    matched: bool = False


def _candidates(output_dir: str, storage_options: Optional[dict], call: Callable, run_id: Optional[str],
                trainer: Optional[str], tally: _Tally) -> Iterator[_Candidate]:
    """The committed checkpoints that pass the run and trainer filters, highest step first, read as they are
    asked for."""
    dirs = call(lambda: checkpoint_dirs(output_dir, storage_options), output_dir, "listing checkpoints")
    for step, url in reversed(dirs):
        manifest = call(lambda u=url: read_manifest(u, storage_options), url, "reading COMMITTED")
        if manifest is None:  # never committed: a write that did not finish
            continue
        writer = manifest.get("written_by") or {}
        if trainer is not None and writer.get("trainer") != trainer:
            tally.others.add(writer.get("trainer", OWN_TRAINER))
            continue
        damage = None
        if run_id is not None:
            try:
                if (writer.get("run") if writer else _run_of(url, storage_options, call)) != run_id:
                    continue
            except CheckpointDamagedError as exc:  # whose it is cannot be told: passed over, not resumed or deleted
                damage = exc
        tally.matched = True
        yield _Candidate(url, step, manifest, damage)


def _run_of(url: str, storage_options: Optional[dict], call: Callable) -> Optional[str]:
    """The run id raytrainer's own loop records in trainer_state.json (stateful_callbacks["raytrainer"])."""
    data = call(lambda: read_bytes(join(url, TRAINER_STATE_NAME), storage_options), url, "reading trainer_state.json")
    with parsing(url, TRAINER_STATE_NAME):
        state = json.loads(data.decode("utf-8"))
        return ((state.get("stateful_callbacks") or {}).get(OWN_STATE_KEY) or {}).get("run_id")


def _newest_first(candidates: list, index: Optional[int], by_commit_time: bool) -> list:
    # Two Trainers of one class writing one output_dir (a script's first and second SFT) are told apart by their
    # place among the script's Trainers; alone in it, a Trainer is itself wherever the script builds it.
    if index is not None and len({(c.manifest.get("written_by") or {}).get("index") for c in candidates}) > 1:
        candidates = [c for c in candidates if (c.manifest.get("written_by") or {}).get("index") == index]
    if not by_commit_time:
        return candidates  # already by step, highest first
    return sorted(candidates, key=lambda c: commit_order(c.manifest, c.step), reverse=True)


def _named(requested: str, storage_options: Optional[dict], hf_folders: bool) -> str:
    """resume_from_checkpoint=<path or URL>: a committed checkpoint, checked against its manifest; never swapped
    for another. With `hf_folders`, a local folder HF wrote without raytrainer is passed to HF as it is."""
    url = absolute_if_local(requested)
    manifest = read_manifest(url, storage_options)
    if manifest is not None:
        damage = verify(url, storage_options, manifest)
        if damage is not None:
            raise damage
        return url
    if not hf_folders:
        raise ConfigError(f"resume_from_checkpoint={url!r} is not a committed checkpoint (missing, or its write "
                          "never finished). resume_from_checkpoint=True resumes from the newest committed one "
                          "(raytrainer.get_last_checkpoint(output_dir) names it, on any URL; transformers' own sees "
                          "local folders only, unfinished ones included); `raytrainer checkpoints OUTPUT_DIR` lists "
                          "them.")
    if is_local(url) and exists(url, storage_options):
        return url
    if not is_local(url):
        raise ConfigError(f"resume_from_checkpoint={requested!r} is not a committed checkpoint (no manifest): "
                          "from a URL, only checkpoints a raytrainer run committed are fetched. Copy the folder "
                          "to a local path and pass that.")
    raise ConfigError(f"resume_from_checkpoint={requested!r}: no such checkpoint.")
