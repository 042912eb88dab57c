"""`WandbCallback`: HF's Weights & Biases reporter, run on the driver with the real `wandb` client.

Configured by HF's (and wandb's own) environment variables:
  WANDB_PROJECT     project to log under; unset: "huggingface", as HF
  WANDB_ENTITY, WANDB_MODE (offline / disabled / online), WANDB_DIR, WANDB_API_KEY, ...: read by wandb itself
  WANDB_RUN_ID      continue this run instead of starting one (wins over the run id stored in a checkpoint)
  WANDB_RESUME      wandb's resume mode for a continued run; unset: "allow"
  WANDB_LOG_MODEL   not supported here (no model artifacts are uploaded): a value other than false warns
A run the user started (`wandb.init(...)` before `trainer.train()`) is logged into. As in HF the run is left open
after training, so a later `trainer.evaluate()` logs into the same run; wandb finishes it at the process's exit
(or call `wandb.finish()`).

Metrics are logged at `step=state.global_step`, once per step whatever the world size, under HF's names
(`train/loss`, `eval/loss`, `test/...`: `rewrite_logs`); the one-off figures of the run (train_runtime,
train_loss, ...) go to the run's summary, as HF puts them. Per-rank figures are logged as `rank1/step_time_s`.

Resuming continues the same W&B run: each committed checkpoint gets a small `wandb_run.json` with the run id,
and `train(resume_from_checkpoint=...)` of a checkpoint under output_dir (`checkpoint-N`) calls
`wandb.init(id=<that id>, resume="allow")`. W&B keeps one value per step: the steps a restarted worker group
replays (after a failure) are below the run's last step, and wandb drops them with a warning.
"""

from __future__ import annotations

import json
import logging
import os
import warnings

from .. import storage
from ..errors import missing_package
from .base import TrainerCallback
from .reporters import AXIS_KEYS, rank_metrics, rewrite_logs

logger = logging.getLogger("raytrainer")

RUN_FILE = "wandb_run.json"  # in each committed checkpoint: the W&B run to continue on resume
# HF's figures of the whole run: the run's summary, not a point of its history.
SINGLE_VALUE_SCALARS = ("train_runtime", "train_samples_per_second", "train_steps_per_second", "train_loss",
                        "total_flos")
def _number(value):
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return value


def _numbers(logs) -> dict:
    """The numeric entries of a log record, the step axis left out (HF logs non-numbers as they are; W&B charts
    only numbers)."""
    values = {key: _number(value) for key, value in (logs or {}).items() if key not in AXIS_KEYS}
    return {key: value for key, value in values.items() if value is not None}


class WandbCallback(TrainerCallback):
    observes_only = True  # never changes control: the workers never wait for it

    def __init__(self):
        try:
            import wandb
        except ImportError:
            raise missing_package("wandb", "wandb", "WandbCallback") from None
        self._wandb = wandb
        self.run = None       # the run logged into (kept after training, for later evaluations)
        self._started = set()  # ids of the runs this callback started (it may finish those)
        log_model = os.getenv("WANDB_LOG_MODEL", "false").lower()
        if log_model not in ("false", "0", "no", "off", ""):
            warnings.warn(f"WANDB_LOG_MODEL={log_model!r}: raytrainer's WandbCallback uploads no model artifacts; "
                          "the checkpoints stay in output_dir.", stacklevel=2)

    # ------------------------------------------------------------------ set-up
    def setup(self, args, state, model=None, resume_id=None):
        """Start, continue or join the run, and put the arguments in its config."""
        wandb = self._wandb
        run_id = os.getenv("WANDB_RUN_ID") or resume_id
        active = wandb.run
        if active is not None and run_id and active.id != run_id and active.id in self._started:
            wandb.finish()  # ours, of an earlier train(): this one continues another run
            active = None
        if active is None:
            init = {"project": os.getenv("WANDB_PROJECT", "huggingface")}
            if state.trial_name is not None:
                init.update(name=state.trial_name, group=args.run_name or args.output_dir)
            elif args.run_name:
                init["name"] = args.run_name
            if run_id:
                init["id"] = run_id
                if not os.getenv("WANDB_RESUME"):
                    init["resume"] = "allow"
            active = wandb.init(**init)
            self._started.add(active.id)
        elif run_id and active.id != run_id:
            logger.warning("W&B: logging into the run already open (%s), not into run %s.", active.id, run_id)
        self.run = active
        config = args.to_dict()  # storage_options redacted
        model_config = getattr(model, "config", None)
        if model_config is not None and hasattr(model_config, "to_dict"):
            config = {**model_config.to_dict(), **config}
        self.run.config.update(config, allow_val_change=True)
        if model is not None and hasattr(model, "parameters"):
            self.run.config.update({"model/num_parameters": sum(p.numel() for p in model.parameters())},
                                   allow_val_change=True)

    def _stored_run_id(self, args, state):
        """The run id kept in the checkpoint this run resumed from (checkpoint-N under output_dir), if any."""
        if state.global_step <= 0:
            return None
        url = storage.join(args.output_dir, f"checkpoint-{state.global_step}", RUN_FILE)
        try:
            options = getattr(args, "storage_options", None)  # None for a hosted Trainer's (HF's) arguments
            if not storage.exists(url, options):
                return None
            return json.loads(storage.read_text(url, options)).get("run_id")
        except Exception as exc:  # noqa: BLE001 (a tracker must not stop training)
            logger.warning("W&B: could not read %s (%s): a new run is started.", RUN_FILE, exc)
            return None

    # ------------------------------------------------------------------ metrics
    def _log(self, logs: dict, state, rank_stats=None):
        metrics = {}
        for key, value in _numbers(logs).items():
            if key in SINGLE_VALUE_SCALARS:
                self.run.summary[key] = value
            else:
                metrics[key] = value
        metrics = rewrite_logs(metrics)
        metrics.update(rank_metrics(rank_stats))
        if metrics:
            self.run.log({**metrics, "train/global_step": state.global_step}, step=state.global_step)

    # ------------------------------------------------------------------ events
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if state.is_hyper_param_search and self.run is not None and self.run.id in self._started:
            self._wandb.finish()  # a new trial: a new run, as HF
            self.run = None
        self.setup(args, state, model, resume_id=self._stored_run_id(args, state))

    def on_log(self, args, state, control, logs=None, model=None, rank_stats=None, **kwargs):
        self._ensure_run(args, state, model)
        self._log(logs, state, rank_stats)

    def on_predict(self, args, state, control, metrics=None, model=None, **kwargs):
        self._ensure_run(args, state, model)
        self._log(metrics, state)

    def _ensure_run(self, args, state, model):
        """trainer.evaluate() / predict() without train(): a run; after wandb.finish(): the same run again."""
        if self.run is None or self._wandb.run is None:
            self.setup(args, state, model, resume_id=None if self.run is None else self.run.id)

    def on_save(self, args, state, control, checkpoint=None, **kwargs):
        """Keep the run id in the committed checkpoint, for a resume to continue this run."""
        if checkpoint is None or self.run is None:
            return
        record = {"run_id": self.run.id, "project": self.run.project, "entity": self.run.entity}
        try:
            storage.write_text(storage.join(checkpoint, RUN_FILE), json.dumps(record) + "\n",
                               getattr(args, "storage_options", None))
        except Exception as exc:  # noqa: BLE001 (a tracker must not stop training)
            logger.warning("W&B: could not write %s into %s (%s): resuming from it starts a new run.",
                           RUN_FILE, checkpoint, exc)

    def on_train_end(self, args, state, control, metrics=None, **kwargs):
        if self.run is None:
            return
        for key, value in _numbers(metrics).items():  # the run's summary (train_runtime, ...), as HF keeps it
            self.run.summary[key] = value
