"""`save_total_limit`: delete the oldest committed checkpoints, never the newest nor the best.

Partial checkpoints are left alone: one may be being written by the workers right now, and it is not
counted against the limit either (`listing.remove_partial` cleans them up when nothing is writing).
"""

from __future__ import annotations

from ..storage import basename
from .listing import best_checkpoint_name, checkpoint_dirs
from .manifest import delete, is_committed


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
    committed = [url for _, url in checkpoint_dirs(output_dir, storage_options)
                 if is_committed(url, storage_options)]
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
