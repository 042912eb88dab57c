"""What the driver-side trackers (W&B, Trackio) share: the numbers of a log record they chart, HF's one-off
figures of a run, and the small record in each committed checkpoint that names the tracker's run, so that a
resume from that checkpoint continues the same run."""

from __future__ import annotations

import json
import logging
from typing import Optional

from .. import storage
from .reporters import AXIS_KEYS

logger = logging.getLogger("raytrainer")

# HF's figures of the whole run (W&B: the run's summary; Trackio: not charted, as in HF), not a point of a curve.
SINGLE_VALUE_SCALARS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss",
                        "total_flos")


def _number(value):
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def numbers(logs) -> dict:
    """The numeric entries of a log record, the step axis left out (HF logs non-numbers as they are; a tracker
    charts only numbers)."""
    values = {key: _number(value) for key, value in (logs or {}).items() if key not in AXIS_KEYS}
    return {key: value for key, value in values.items() if value is not None}


def read_run_record(args, state, filename: str, tracker: str) -> Optional[dict]:
    """The record `filename` kept in the checkpoint this run resumed from (checkpoint-N under output_dir), if
    any. A tracker must not stop training: an unreadable record is a warning and a new run."""
    if state.global_step <= 0:
        return None
    url = storage.join(args.output_dir, f"checkpoint-{state.global_step}", filename)
    try:
        options = getattr(args, "storage_options", None)  # None for a hosted Trainer's (HF's) arguments
        if not storage.exists(url, options):
            return None
        return json.loads(storage.read_text(url, options))
    except Exception as exc:  # noqa: BLE001
        logger.warning("%s: could not read %s (%s): a new run is started.", tracker, filename, exc)
        return None


def write_run_record(args, checkpoint: str, filename: str, record: dict, tracker: str) -> None:
    """Keep `record` (the tracker's run) in a committed checkpoint, for a resume to continue that run."""
    try:
        storage.write_text(storage.join(checkpoint, filename), json.dumps(record) + "\n",
                           getattr(args, "storage_options", None))
    except Exception as exc:  # noqa: BLE001 (a tracker must not stop training)
        logger.warning("%s: could not write %s into %s (%s): resuming from it starts a new run.",
                       tracker, filename, checkpoint, exc)


def run_config(args, model=None) -> dict:
    """A tracker run's config, as transformers' integrations fill it: the arguments (storage_options redacted),
    under the model's config where it has one, and the model's parameter count."""
    config = args.to_dict()
    model_config = getattr(model, "config", None)
    if model_config is not None and hasattr(model_config, "to_dict"):
        config = {**model_config.to_dict(), **config}
    if model is not None and hasattr(model, "parameters"):
        config["model/num_parameters"] = sum(p.numel() for p in model.parameters())
    return config
