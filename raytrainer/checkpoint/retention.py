"""`save_total_limit`: delete the oldest committed checkpoints, never the newest nor the best; at the end of
training with a limit of one, as transformers ends it, every one but the best (`keep_only_best`).

Oldest and newest are by commit time (the manifest's `created`; by step where two tie), as transformers rotates
by modification time: a run started afresh in an output_dir that holds a longer earlier run's checkpoints
writes lower steps than those, and the checkpoint it has just committed is still its newest (by step it would
be deleted at once, and the run stop on finding it gone). The earlier run's checkpoints, committed before any
of this run's, are the first deleted.

Partial checkpoints are left alone: one may be being written by the workers right now, and it is not
counted against the limit either (`listing.remove_partial` cleans them up when nothing is writing).
"""

from __future__ import annotations

import logging
from typing import Callable

from ..storage import basename
from .listing import best_checkpoint_name, checkpoint_dirs
from .manifest import commit_order, delete, files_match, list_files, read_manifest

logger = logging.getLogger("raytrainer")


def rotate(output_dir: str, save_total_limit: int | None, best_url: str | None = None,
           storage_options: dict | None = None) -> list[str]:
    """Keep at most `save_total_limit` committed checkpoints; returns the URLs deleted, oldest first.

    `best_url` is compared by basename (it may be a full URL or a local path); when None, the
    `best_model_checkpoint` recorded in the newest committed checkpoint's trainer_state.json is protected.
    """
    if save_total_limit is None:
        return []
    if save_total_limit < 1:
        raise ValueError(f"save_total_limit={save_total_limit!r} must be >= 1 (or None to keep all).")
    committed = _in_commit_order(output_dir, storage_options)
    if not committed:
        return []
    newest = basename(committed[-1])
    best = basename(best_url) if best_url else best_checkpoint_name(committed[-1], storage_options)
    protected = {newest} | ({best} if best else set())
    limit = save_total_limit
    if limit == 1 and best and best != newest and best in {basename(u) for u in committed}:
        limit = 2  # as in HF: with a limit of one, the best and the newest are both kept
    excess = len(committed) - limit
    deleted = []
    for url in committed:
        if excess <= 0:
            break
        if basename(url) in protected:
            continue
        delete(url, storage_options)
        deleted.append(url)
        excess -= 1
    return deleted


def _in_commit_order(output_dir: str, storage_options: dict | None) -> list[str]:
    """The committed checkpoints (manifest present, files matching it), the first committed first."""
    found = []
    for step, url in checkpoint_dirs(output_dir, storage_options):
        manifest = read_manifest(url, storage_options)
        if manifest is not None and files_match(manifest, list_files(url, storage_options)):
            found.append((commit_order(manifest, step), url))
    return [url for _, url in sorted(found)]


def keep_only_best(output_dir: str, best_url: str, storage_options: dict | None = None) -> list[str]:
    """transformers' end of training with `save_total_limit=1` and a best checkpoint: every committed checkpoint
    but the best is deleted, the newest too (the best's weights are the trained model's). Returns the URLs
    deleted. Partial ones are left, as `rotate` leaves them."""
    best, committed = basename(best_url), _in_commit_order(output_dir, storage_options)
    if best not in {basename(url) for url in committed}:
        return []  # the best is not here (another output_dir's, or lost): nothing is deleted for it
    deleted = [url for url in committed if basename(url) != best]
    for url in deleted:
        delete(url, storage_options)
    return deleted


def end_keeping_only_best(output_dir: str, best_url: str, storage_options: dict | None,
                          check_lease: Callable[[], None], call: Callable = lambda fn: fn()) -> None:
    """`keep_only_best` once training is done (the own loop's rank 0, the hosted mode's remote copies), after
    `check_lease` (the run's lease still ours), through `call` (a storage retry): any failure is a warning, since
    a checkpoint left over loses nothing."""
    try:
        check_lease()
        call(lambda: keep_only_best(output_dir, best_url, storage_options))
    except Exception as exc:  # noqa: BLE001
        logger.warning("save_total_limit=1: the checkpoints other than the best stay under %s (%s)", output_dir, exc)
