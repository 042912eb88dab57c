"""`TrackioCallback`: HF's Trackio reporter, run on the driver with the real `trackio` client.

The run is logged to Trackio's local store (`TRACKIO_DIR`, else `~/.cache/huggingface/trackio`; see it with
`trackio show --project <project>`), under `args.project` (HF's field, default "huggingface") and `args.run_name`
(None: Trackio names the run). Syncing to a Hugging Face Space from inside the run (`trackio_space_id`,
`trackio_bucket_id`, `trackio_static_space_id`) is not done here: the own loop refuses those arguments, the hosted
mode warns and logs locally; `trackio sync --project <project> --space-id <id>` uploads the store afterwards.

Metrics are logged at `step=state.global_step`, once per step whatever the world size, under HF's names
(`train/loss`, `eval/loss`, ...: `rewrite_logs`), with per-rank figures as `rank1/step_time_s`. HF's one-off
figures of the run (train_runtime, train_loss, ...) are not charted, as in HF's own callback.

Resuming continues the same Trackio run: each committed checkpoint gets a small `trackio_run.json` with the
project and run name, and `train(resume_from_checkpoint=...)` of a checkpoint under output_dir calls
`trackio.init(project, name, resume="allow")`. Steps a restarted worker group replays (after a failure) are below
the last step this process logged into the run, and are dropped (W&B drops them too); a rerun after the driver
itself died logs again the steps between its checkpoint and the point it died.

The run is finished at the end of training (Trackio writes its last records then), as in HF; a later
`trainer.evaluate()` or `predict()` continues the same run, which Trackio finishes at the process's exit (or
call `trackio.finish()`).
"""

from __future__ import annotations

import logging

from ..errors import missing_package
from .base import TrainerCallback
from .reporters import rank_metrics, rewrite_logs
from .tracker_runs import SINGLE_VALUE_SCALARS, numbers, read_run_record, run_config, write_run_record

logger = logging.getLogger("raytrainer")

RUN_FILE = "trackio_run.json"  # in each committed checkpoint: the Trackio run to continue on resume
SPACE_FIELDS = ("trackio_space_id", "trackio_bucket_id", "trackio_static_space_id")


class TrackioCallback(TrainerCallback):
    observes_only = True  # never changes control: the workers never wait for it

    def __init__(self):
        try:
            import trackio
        except ImportError:
            raise missing_package("trackio", "trackio", "TrackioCallback") from None
        self._trackio = trackio
        self.run = None         # the run logged into, open or finished (a later evaluate() continues it)
        self._open = False      # whether this callback's run is the one trackio has open now
        self._last_step = -1    # the highest step logged into the run by this process

    # ------------------------------------------------------------------ set-up
    def setup(self, args, state, model=None, record=None):
        """Start or continue the run (`record`: the project and name a checkpoint named)."""
        project = (record or {}).get("project") or getattr(args, "project", None) or "huggingface"
        name = (record or {}).get("name") or (self.run.name if self.run is not None else None)
        init = {"project": project, "resume": "allow", "config": run_config(args, model)}
        if state.trial_name is not None:  # a trial of hyperparameter_search: grouped under the sweep
            init.update(name=name or state.trial_name, group=args.run_name or args.output_dir)
        else:
            init["name"] = name or args.run_name
        for field in SPACE_FIELDS:
            if getattr(args, field, None):
                logger.warning("Trackio: %s=%r is not synced from the run; its metrics are in the local store "
                               "(run `trackio sync --project %s` afterwards).", field, getattr(args, field), project)
        self.run = self._trackio.init(**init)
        self._open = True

    def _ensure_run(self, args, state, model):
        """evaluate() / predict() without train(), or after it finished the run: the same run, continued."""
        if not self._open:
            self.setup(args, state, model)

    # ------------------------------------------------------------------ metrics
    def _log(self, logs: dict, state, rank_stats=None):
        if state.global_step < self._last_step:
            return  # a restarted group replaying steps already logged
        metrics = rewrite_logs({k: v for k, v in numbers(logs).items() if k not in SINGLE_VALUE_SCALARS})
        metrics.update(rank_metrics(rank_stats))
        if metrics:
            self._trackio.log({**metrics, "train/global_step": state.global_step}, step=state.global_step)
            self._last_step = state.global_step

    # ------------------------------------------------------------------ events
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self._open:  # an earlier train()'s or a trial's run: this one starts or continues its own
            self._finish()
        if state.is_hyper_param_search:
            self.run = None  # a new trial: a new run, as HF
        self._last_step = -1
        self.setup(args, state, model, record=read_run_record(args, state, RUN_FILE, "Trackio"))

    def on_log(self, args, state, control, logs=None, model=None, rank_stats=None, **kwargs):
        self._ensure_run(args, state, model)
        self._log(logs, state, rank_stats)

    def on_predict(self, args, state, control, metrics=None, model=None, **kwargs):
        self._ensure_run(args, state, model)
        self._log(metrics, state)

    def on_save(self, args, state, control, checkpoint=None, **kwargs):
        """Keep the project and run name in the committed checkpoint, for a resume to continue this run."""
        if checkpoint is not None and self.run is not None:
            write_run_record(args, checkpoint, RUN_FILE, {"project": self.run.project, "name": self.run.name},
                             "Trackio")

    def on_train_end(self, args, state, control, **kwargs):
        self._finish()

    def _finish(self):
        if self._open:
            self._open = False
            self._trackio.finish()
