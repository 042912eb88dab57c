"""`EarlyStoppingCallback`: Hugging Face's, with its semantics.

After each evaluation, the metric `metric_for_best_model` is compared with the best of the earlier evaluations;
`early_stopping_patience` evaluations in a row without an improvement larger than `early_stopping_threshold`
set `control.should_training_stop`. It runs on the driver, on metrics already reduced across ranks; the
driver applies the stop on every rank at the same step.

The best value is the callback's own (initialised from `state.best_metric` when training begins, then
updated after each evaluation), as HF 5 updates `state.best_metric` after `on_evaluate`: the comparison never
depends on when the driver's copy of the state learns about a new best checkpoint.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..errors import ConfigError
from .base import TrainerCallback
from .stateful import RESTORED


class EarlyStoppingCallback(TrainerCallback):
    def __init__(self, early_stopping_patience: int = 1, early_stopping_threshold: float | None = 0.0):
        if not isinstance(early_stopping_patience, int) or early_stopping_patience < 1:
            raise ConfigError(f"early_stopping_patience={early_stopping_patience!r} must be an int >= 1.")
        self.early_stopping_patience = early_stopping_patience
        self.early_stopping_threshold = early_stopping_threshold or 0.0
        # The number of evaluations in a row that did not improve the metric (HF's name).
        self.early_stopping_patience_counter = 0
        self.best_metric = None

    @staticmethod
    def check_args(args):
        if args.metric_for_best_model is None:
            raise ConfigError("EarlyStoppingCallback needs metric_for_best_model (e.g. 'eval_loss'), or "
                              "load_best_model_at_end=True, which defaults it to 'loss'.")
        if args.eval_strategy == "no":
            raise ConfigError("EarlyStoppingCallback needs evaluations: set eval_strategy='steps' or 'epoch' "
                              "(and an eval_dataset).")

    def check_metric_value(self, args, state, control, metric_value):
        operator = np.greater if args.greater_is_better else np.less
        if self.best_metric is None or (operator(metric_value, self.best_metric)
                                        and abs(metric_value - self.best_metric) > self.early_stopping_threshold):
            self.early_stopping_patience_counter = 0
        else:
            self.early_stopping_patience_counter += 1
        if self.best_metric is None or operator(metric_value, self.best_metric):
            self.best_metric = float(metric_value)

    def on_init_end(self, args, state, control, **kwargs):
        self.check_args(args)

    def on_train_begin(self, args, state, control, **kwargs):
        self.check_args(args)
        if not args.load_best_model_at_end:
            warnings.warn("EarlyStoppingCallback without load_best_model_at_end=True: once training stops, the "
                          "model is the last one, not the best.", stacklevel=2)
        if not self.__dict__.pop(RESTORED, False):  # restore_callback_states_from_checkpoint set the counter
            self.early_stopping_patience_counter = 0
        self.best_metric = state.best_metric  # a resumed run continues from its checkpoint's best

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        name = args.metric_for_best_model
        key = name if name.startswith("eval_") else f"eval_{name}"
        value = (metrics or {}).get(key)
        if value is None:
            warnings.warn(f"EarlyStoppingCallback: {key!r} is not among the evaluation metrics "
                          f"{sorted(metrics or {})}; early stopping is off for this evaluation.", stacklevel=2)
            return
        self.check_metric_value(args, state, control, float(value))
        if self.early_stopping_patience_counter >= self.early_stopping_patience:
            control.should_training_stop = True

    def state(self) -> dict:
        """HF's ExportableState shape, for trainer_state.json's stateful_callbacks."""
        return {"args": {"early_stopping_patience": self.early_stopping_patience,
                         "early_stopping_threshold": self.early_stopping_threshold},
                "attributes": {"early_stopping_patience_counter": self.early_stopping_patience_counter}}
