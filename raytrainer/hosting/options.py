"""raytrainer's options of a hosted run: given beside the trainer (`hosted(SFTTrainer, num_workers=2)`,
`raytrainer launch --num_workers 2 script.py`), never inside its own arguments object.

They are the fields of raytrainer's `TrainingArguments` that concern the workers and the driver, not the
training itself (which the trainer's own arguments say), plus `resume`. They are checked by building a
`TrainingArguments` of them, so their meaning and their checks are the own loop's.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, Tuple

from ..arguments.training_args import TrainingArguments
from ..errors import ConfigError

HOST_OPTIONS = (
    "num_workers", "max_failures", "max_preemptions", "storage_options", "resources_per_worker", "use_gpu",
    "ray_address", "worker_idle_timeout_s", "elastic_resize_monitor_interval_s", "report_to", "logging_dir",
    "run_name", "disable_tqdm", "log_level", "log_level_replica", "ddp_timeout", "callback_decisions",
    "hang_warning_s",
)
# Ours only: a Trainer whose train() gets no resume_from_checkpoint continues from its newest checkpoint.
RESUME = "resume"


def host_options(options: Dict[str, Any], where: str) -> Tuple[TrainingArguments, bool]:
    """(raytrainer's arguments of the run, resume) from the options given `where` (named in errors)."""
    unknown = sorted(set(options) - set(HOST_OPTIONS) - {RESUME})
    if unknown:
        raise ConfigError(
            f"{where} got {', '.join(unknown)}, which is not an option of a hosted run. raytrainer's options are "
            f"{', '.join(HOST_OPTIONS + (RESUME,))}; the training's own settings go into the trainer's arguments "
            "object (SFTConfig(...), Seq2SeqTrainingArguments(...), ...).")
    options = dict(options)
    resume = options.pop(RESUME, True)
    if not isinstance(resume, bool):
        raise ConfigError(f"resume={resume!r}: True (continue from the newest checkpoint) or False (start fresh).")
    # output_dir is each Trainer's own (claimed when its train() begins): a placeholder the run never writes,
    # and the multi-node check of a local output_dir is the claim's (hosting/claims.py).
    args = TrainingArguments(output_dir=os.path.join(tempfile.gettempdir(), "raytrainer-hosted"),
                             allow_local_output_dir_on_multinode=True, **options)
    if "logging_dir" not in options:
        args.logging_dir = None  # reporters write under the claimed output_dir
    return args, resume


def misplaced(names) -> list:
    """The names among `names` that are raytrainer's options (given inside the trainer's arguments)."""
    return sorted(set(names) & set(HOST_OPTIONS + (RESUME,)))
