"""`MLflowCallback`: HF's MLflow reporter, run on the driver with the real MLflow client.

Configured by HF's environment variables:
  MLFLOW_TRACKING_URI      where runs are stored (a server URL, or sqlite:///path/mlflow.db); unset: MLflow's default
  MLFLOW_EXPERIMENT_NAME   experiment to log under (created if missing); unset: MLflow's default experiment
  MLFLOW_RUN_ID            continue this run (e.g. after resuming from a checkpoint) instead of starting one
  MLFLOW_TAGS              JSON object of tags for the run
  MLFLOW_NESTED_RUN        true: start a run nested in the active one
  MLFLOW_FLATTEN_PARAMS    true: nested dict arguments become `parent.child` parameters
  MLFLOW_MAX_LOG_PARAMS    log at most this many parameters
A run the user started (`with mlflow.start_run(): trainer.train()`) is logged into and left open; a run this
callback started is ended at the end of training. Metrics are logged at `state.global_step`, once per step
whatever the world size; evaluations after training (`trainer.evaluate()`) go to the same run.
"""

from __future__ import annotations

import json
import os
import re
import time
import warnings

from ..errors import missing_package
from .base import TrainerCallback
from .reporters import AXIS_KEYS, rank_metrics

TRUE = ("1", "TRUE", "YES", "ON")


def _flag(name: str) -> bool:
    return os.getenv(name, "FALSE").upper() in TRUE


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


class MLflowCallback(TrainerCallback):
    observes_only = True  # never changes control: the workers never wait for it

    def __init__(self):
        try:
            import mlflow
        except ImportError:
            raise missing_package("mlflow", "mlflow", "MLflowCallback") from None
        from mlflow.utils.validation import MAX_PARAM_VAL_LENGTH, MAX_PARAMS_TAGS_PER_BATCH

        self._ml_flow = mlflow
        self._max_param_length = MAX_PARAM_VAL_LENGTH
        self._batch = MAX_PARAMS_TAGS_PER_BATCH
        self.run_id = None          # the run logged into (kept after training, for later evaluations)
        self._auto_end_run = False  # this callback started the run, so it ends it
        self._in_train = False
        self._logged = set()        # (step, key): an event reported twice (on_log and on_evaluate) is logged once

    # ------------------------------------------------------------------ set-up
    def setup(self, args, state, model=None):
        """Start (or join) the run and log the arguments as parameters."""
        mlflow = self._ml_flow
        tracking_uri = os.getenv("MLFLOW_TRACKING_URI")
        if tracking_uri and not mlflow.is_tracking_uri_set():
            mlflow.set_tracking_uri(tracking_uri)
        run_id, nested = os.getenv("MLFLOW_RUN_ID"), _flag("MLFLOW_NESTED_RUN")
        self._auto_end_run = False
        if mlflow.active_run() is None or nested or run_id:
            experiment = os.getenv("MLFLOW_EXPERIMENT_NAME")
            if experiment and not run_id:
                mlflow.set_experiment(experiment)
            mlflow.start_run(run_id=run_id, run_name=None if run_id else args.run_name, nested=nested)
            self._auto_end_run = True
        self.run_id = mlflow.active_run().info.run_id
        self._logged.clear()
        self._log_params(args, model)
        tags = os.getenv("MLFLOW_TAGS")
        if tags:
            mlflow.set_tags(json.loads(tags))

    def _log_params(self, args, model):
        params = args.to_dict()  # storage_options redacted
        config = getattr(model, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            params = {**config.to_dict(), **params}
        if _flag("MLFLOW_FLATTEN_PARAMS"):
            params = flatten(params)
        dropped = [k for k, v in params.items() if len(str(v)) > self._max_param_length]
        if dropped:  # HF drops them too: MLflow refuses the whole batch otherwise
            warnings.warn(f"MLflow: parameters {dropped} are longer than {self._max_param_length} characters and "
                          "were not logged (MLFLOW_FLATTEN_PARAMS=true splits nested ones).", stacklevel=3)
        items = [(k, v) for k, v in params.items() if k not in dropped]
        limit = os.getenv("MLFLOW_MAX_LOG_PARAMS", "")
        if limit.isdigit():
            items = items[:int(limit)]
        if self._params_already_logged():
            return  # a continued run (MLFLOW_RUN_ID) has them; MLflow refuses to change a logged parameter
        for i in range(0, len(items), self._batch):
            self._ml_flow.log_params(dict(items[i:i + self._batch]))

    def _params_already_logged(self) -> bool:
        return bool(self._ml_flow.MlflowClient().get_run(self.run_id).data.params)

    # ------------------------------------------------------------------ metrics
    def _log_metrics(self, logs: dict, step: int):
        metrics = {}
        for key, value in (logs or {}).items():
            if key in AXIS_KEYS or (step, key) in self._logged:
                continue
            if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
                value = value.item()
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue  # HF warns and drops non-numbers: MLflow metrics are floats
            self._logged.add((step, key))
            metrics[re.sub(r"[^0-9A-Za-z_\-. :/]", "_", key)] = float(value)  # MLflow's allowed characters
        if metrics:
            # The client with an explicit run id: also right after the run ended (trainer.evaluate() later).
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            self._ml_flow.MlflowClient().log_batch(
                self.run_id, metrics=[Metric(k, v, now, step) for k, v in metrics.items()])

    # ------------------------------------------------------------------ events
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self._in_train:
            return  # already set up (an event may reach us once per rank on older drivers)
        self._in_train = True
        self.setup(args, state, model)

    def on_log(self, args, state, control, logs=None, model=None, rank_stats=None, **kwargs):
        if self.run_id is None:
            self.setup(args, state, model)
        self._log_metrics({**(logs or {}), **rank_metrics(rank_stats)}, state.global_step)
        if not self._in_train:  # trainer.evaluate() without train(): a run this callback started ends here
            self._end()

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        # HF reports evaluations through on_log; here they also arrive as their own event.
        self.on_log(args, state, control, logs=metrics)

    def on_restart(self, args, state, control, **kwargs):
        # Replayed steps are logged again (MLflow keeps both values of a step; the later one is the kept run's).
        self._logged = {(s, k) for s, k in self._logged if s <= state.global_step}

    def on_train_end(self, args, state, control, metrics=None, **kwargs):
        self._in_train = False
        if self.run_id is None:
            return
        self._log_metrics(metrics, state.global_step)  # the run's summary (train_runtime, ...), as HF logs it
        self._end()

    def _end(self):
        active = self._ml_flow.active_run()
        if self._auto_end_run and active is not None and active.info.run_id == self.run_id:
            self._ml_flow.end_run()
