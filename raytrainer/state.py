"""Trainer state and the HF-shaped result types.

`TrainerState` serialises to the same `trainer_state.json` as Hugging Face's (transformers'
`TrainerState.load_from_json` reads ours). HF's loader passes every top-level key to the constructor, so our
own fields (data position, world size, run id, restarts, resizes, the start-up timeline) live under
`stateful_callbacks["raytrainer"]`, the one HF field meant for extra state.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

import numpy as np

OWN_STATE_KEY = "raytrainer"


def _own_int(name: str):
    """Getter and setter of an int kept in `stateful_callbacks["raytrainer"]`."""
    return (lambda self: int(self.own.get(name, 0)),
            lambda self, value: self.own.__setitem__(name, int(value)))


@dataclass
class TrainerState:
    epoch: float = 0
    global_step: int = 0
    max_steps: int = 0
    logging_steps: int = 500
    eval_steps: int = 500
    save_steps: int = 500
    train_batch_size: Optional[int] = None
    num_train_epochs: int = 0
    num_input_tokens_seen: int = 0
    total_flos: float = 0
    log_history: list = field(default_factory=list)
    best_metric: Optional[float] = None
    best_global_step: Optional[int] = None
    best_model_checkpoint: Optional[str] = None
    is_local_process_zero: bool = True
    is_world_process_zero: bool = True
    is_hyper_param_search: bool = False
    trial_name: Optional[str] = None
    trial_params: Optional[dict] = None
    stateful_callbacks: dict = field(default_factory=dict)

    # ---- our fields, kept inside stateful_callbacks so HF can load the file ----
    @property
    def own(self) -> dict:
        return self.stateful_callbacks.setdefault(OWN_STATE_KEY, {})

    # The data position: a global sample offset into the current epoch's order (world-size free).
    samples_seen_in_epoch = property(*_own_int("samples_seen_in_epoch"))
    epoch_index = property(*_own_int("epoch_index"))

    @property
    def restarts(self) -> list:
        """Each new worker group of this run: step, reason (failure / preemption / resize), cause, checkpoint."""
        return self.own.setdefault("restarts", [])

    @property
    def resizes(self) -> list:
        """Each change of world size: time, previous and new world size, cause, checkpoint used."""
        return self.own.setdefault("resizes", [])

    @property
    def startup(self) -> Optional[dict]:
        """Where the train() call's start-up time went (`startup.py`): total_s, group, phases_s, loss_check_s."""
        return self.own.get("startup")

    @startup.setter
    def startup(self, record: Optional[dict]):
        self.own["startup"] = record

    def to_json_string(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True, default=_json_default) + "\n"

    @classmethod
    def from_json_string(cls, text: str) -> "TrainerState":
        data = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def save_to_json(self, json_path: str) -> None:
        """transformers' method: this state as trainer_state.json is written (a local path)."""
        with open(json_path, "w", encoding="utf-8") as f:
            f.write(self.to_json_string())

    @classmethod
    def load_from_json(cls, json_path: str) -> "TrainerState":
        """transformers' method: a trainer_state.json read back (a checkpoint's, say; a local path)."""
        with open(json_path, encoding="utf-8") as f:
            return cls.from_json_string(f.read())


def _json_default(value: Any):
    if isinstance(value, (np.generic,)):
        return value.item()
    if hasattr(value, "item"):  # 0-d tensors
        return value.item()
    return str(value)


@dataclass
class TrainerControl:
    """What a callback asks the loop to do. Kept HF-shaped; decisions are applied at an agreed step."""
    should_training_stop: bool = False
    should_epoch_stop: bool = False
    should_save: bool = False
    should_evaluate: bool = False
    should_log: bool = False


class TrainOutput(NamedTuple):
    global_step: int
    training_loss: float
    metrics: dict


class EvalPrediction:
    """Predictions and labels for `compute_metrics`, as in HF (`preds, labels = eval_pred` works)."""

    def __init__(self, predictions, label_ids, inputs=None, losses=None):
        self.predictions = predictions
        self.label_ids = label_ids
        self.inputs = inputs
        self.losses = losses

    def __iter__(self):
        return iter((self.predictions, self.label_ids))

    def __getitem__(self, idx):
        return (self.predictions, self.label_ids)[idx]


class PredictionOutput(NamedTuple):
    predictions: Any
    label_ids: Any
    metrics: Optional[dict]
