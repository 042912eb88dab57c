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

import logging
import os
import warnings

from ..errors import missing_package
from .base import TrainerCallback
from .reporters import rank_metrics, rewrite_logs
from .tracker_runs import SINGLE_VALUE_SCALARS, numbers, read_run_record, run_config, write_run_record

logger = logging.getLogger("raytrainer")

RUN_FILE = "wandb_run.json"  # in each committed checkpoint: the W&B run to continue on resume


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
        self.run.config.update(run_config(args, model), allow_val_change=True)

    def _stored_run_id(self, args, state):
        """The run id kept in the checkpoint this run resumed from (checkpoint-N under output_dir), if any."""
        record = read_run_record(args, state, RUN_FILE, "W&B")
        return record.get("run_id") if record else None

    # ------------------------------------------------------------------ metrics
    def _log(self, logs: dict, state, rank_stats=None):
        metrics = {}
        for key, value in numbers(logs).items():
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
        write_run_record(args, checkpoint, RUN_FILE, record, "W&B")

    def on_train_end(self, args, state, control, metrics=None, **kwargs):
        if self.run is None:
            return
        for key, value in numbers(metrics).items():  # the run's summary (train_runtime, ...), as HF keeps it
            self.run.summary[key] = value
