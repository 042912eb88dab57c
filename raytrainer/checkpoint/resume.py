"""Which checkpoint a run resumes from, checked against its manifest before anything is loaded.

`resolve` runs on the driver, before any actor starts: a damaged checkpoint (a file missing, truncated, or
changed since it was committed) is refused with an error naming the file and the checkpoint. Only with
`resume_from_checkpoint=True` does the run fall back to the newest intact checkpoint, and it says so on the
console. A damaged checkpoint is never deleted (see listing.remove_partial); it stays as evidence. What
counts as damage is damage.py's (`verify`).
"""

from __future__ import annotations

from typing import Optional, Union

from ..errors import ConfigError
from ..storage import absolute_if_local, basename
from ..verbosity import notice
from .damage import CheckpointDamagedError, verify
from .listing import checkpoint_dirs
from .manifest import read_manifest


def resolve(output_dir: str, requested: Union[str, bool, None],
            storage_options: Optional[dict] = None) -> Optional[str]:
    """True: the newest intact committed checkpoint under output_dir; a path/URL: that one, if committed and
    intact; None/False: no resume."""
    if requested in (None, False):
        return None
    if requested is True:
        return _newest_intact(output_dir, storage_options)
    url = absolute_if_local(str(requested))
    manifest = read_manifest(url, storage_options)
    if manifest is None:
        raise ConfigError(f"resume_from_checkpoint={url!r} is not a committed checkpoint (missing, or its write "
                          "never finished). resume_from_checkpoint=True resumes from the newest committed one "
                          "(raytrainer.get_last_checkpoint(output_dir) names it, on any URL; transformers' own sees "
                          "local folders only, unfinished ones included); `raytrainer checkpoints OUTPUT_DIR` lists "
                          "them.")
    damage = verify(url, storage_options, manifest)
    if damage is not None:
        raise damage
    return url


def _newest_intact(output_dir: str, storage_options: Optional[dict]) -> str:
    damaged = []
    for _, url in reversed(checkpoint_dirs(output_dir, storage_options)):
        manifest = read_manifest(url, storage_options)
        if manifest is None:  # never committed: a write that did not finish
            continue
        damage = verify(url, storage_options, manifest)
        if damage is None:
            if damaged:
                notice(f"resume_from_checkpoint=True: resuming from {basename(url)}, the newest intact checkpoint "
                        f"under {output_dir}, because " + "; ".join(f"{basename(d.ckpt_url)} is damaged "
                                                                     f"({d.name}: {d.problem})" for d in damaged)
                        + ". The damaged ones are left in place.")
            return url
        damaged.append(damage)
    if damaged:
        raise CheckpointDamagedError(damaged[0].ckpt_url, damaged[0].name, damaged[0].problem, hint=(
            f"No committed checkpoint under {output_dir} is intact ({len(damaged)} damaged, all left in place). "
            "Restore the files from a copy, or start a new run."))
    raise ConfigError(f"resume_from_checkpoint=True but {output_dir!r} holds no committed checkpoint. Train "
                      "without resuming, or point at a checkpoint.")


