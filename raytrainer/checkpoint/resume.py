"""Which checkpoint a run resumes from, checked against its manifest before anything is loaded.

`resolve` runs on the driver, before any actor starts: a damaged checkpoint (a file missing, truncated, or
changed since it was committed) is refused with an error naming the file and the checkpoint. Only with
`resume_from_checkpoint=True` does the run fall back to the newest intact checkpoint, and it says so on the
console. The choice itself is choice.py's, the one a restarted worker group and the hosted mode make too;
here is what the driver does when nothing fits. What counts as damage is damage.py's (`verify`).
"""

from __future__ import annotations

from typing import Optional, Union

from ..errors import ConfigError
from .choice import choose
from .damage import CheckpointDamagedError


def resolve(output_dir: str, requested: Union[str, bool, None],
            storage_options: Optional[dict] = None) -> Optional[str]:
    """True: the newest intact committed checkpoint under output_dir; a path/URL: that one, if committed and
    intact; None/False: no resume."""
    if requested in (None, False):
        return None
    if requested is not True:
        return choose(output_dir, storage_options, named=str(requested)).url
    # Said only when damage was passed over: the workers say which checkpoint they resume from.
    found = choose(output_dir, storage_options, doing="resume_from_checkpoint=True: resuming", quiet_if_clean=True)
    if found.url is not None:
        return found.url
    if found.damaged:
        first = found.damaged[0]
        raise CheckpointDamagedError(first.ckpt_url, first.name, first.problem, hint=(
            f"No committed checkpoint under {output_dir} is intact ({len(found.damaged)} damaged, all left in "
            "place). Restore the files from a copy, or start a new run."))
    raise ConfigError(f"resume_from_checkpoint=True but {output_dir!r} holds no committed checkpoint. Train "
                      "without resuming, or point at a checkpoint.")
