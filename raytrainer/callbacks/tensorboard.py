"""`TensorBoardCallback`: HF's TensorBoard reporter, written from the driver, to a local directory or a URL.

One writer on the driver sees the whole run (metrics reduced across ranks), so there is one event file per
run whatever the world size. Tags are HF's (`train/loss`, `eval/loss`, `test/...`) at `state.global_step`.

TensorBoard's writer only writes local files, so for a URL (s3://...) it writes into a local staging
directory whose files are uploaded through fsspec (with `storage_options`, never logged) at most every
`upload_interval_s` and at the end of training. After a worker-group restart the steps after the checkpoint
are replayed: a SessionLog START at the first replayed step makes TensorBoard hide the stale points.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import warnings

from .. import storage
from ..errors import missing_package
from .base import TrainerCallback
from .reporters import rank_metrics, rewrite_logs


class TensorBoardCallback(TrainerCallback):
    observes_only = True  # never changes control: the workers never wait for it

    def __init__(self, tb_writer=None, upload_interval_s: float = 30.0):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise missing_package("tensorboard", "tensorboard", "TensorBoardCallback") from None
        self._SummaryWriter = SummaryWriter
        self.tb_writer = tb_writer
        self.upload_interval_s = upload_interval_s
        self.logging_dir = None
        self._staging = None        # local directory the writer uses when logging_dir is a URL
        self._storage_options = None
        self._last_upload = 0.0
        self._upload_warned = False
        self._written = set()       # (step, tag, value): an event reported twice (on_log, on_evaluate) is written once
        self._in_train = False

    # ------------------------------------------------------------------ writer and uploads
    def _open(self, args):
        if self.tb_writer is not None:
            return
        self.logging_dir = args.logging_dir or storage.join(args.output_dir, "runs")
        self._storage_options = args.storage_options
        if storage.is_local(self.logging_dir):
            local = storage.local_path(self.logging_dir)
        else:
            local = self._staging = tempfile.mkdtemp(prefix="raytrainer-tensorboard-")
        self.tb_writer = self._SummaryWriter(log_dir=local)

    def _upload(self, force: bool = False):
        """Copy the staged event files to logging_dir; whole files, since object stores cannot append."""
        if self._staging is None or (not force and time.monotonic() - self._last_upload < self.upload_interval_s):
            return
        self._last_upload = time.monotonic()
        try:
            fs, root = storage.get_fs(self.logging_dir, self._storage_options)
            for folder, _, files in os.walk(self._staging):
                for name in files:
                    local = os.path.join(folder, name)
                    relative = os.path.relpath(local, self._staging).replace(os.sep, "/")
                    fs.put_file(local, root.rstrip("/") + "/" + relative)
        except Exception as exc:  # a tracker must not end a training run; say so once, retry at the next upload
            if force or not self._upload_warned:
                self._upload_warned = True
                error = storage.describe_error(self.logging_dir, exc, self._storage_options)
                warnings.warn(f"TensorBoard event files could not be uploaded (training goes on): {error}",
                              stacklevel=2)

    def _scalars(self, logs: dict, step: int):
        if not logs:
            return
        for tag, value in rewrite_logs(logs).items():
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
                    value = value.item()
                else:
                    continue  # HF warns and drops non-scalars too
            if (step, tag, value) in self._written:
                continue
            self._written.add((step, tag, value))
            if isinstance(value, str):
                self.tb_writer.add_text(tag, value, step)
            else:
                self.tb_writer.add_scalar(tag, value, step)
        self.tb_writer.flush()
        self._upload()

    # ------------------------------------------------------------------ events
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self._in_train:
            return  # already open (an event may reach us once per rank on older drivers)
        self._in_train = True
        self._open(args)
        self._written.clear()  # a new run: its steps start over (a resumed one purges what follows below)
        if state.global_step > 0:  # resumed: an earlier run may have logged past this checkpoint in this directory
            self._purge_from(state.global_step + 1)
        self.tb_writer.add_text("args", args.to_json_string())  # secrets are redacted by to_json_string
        config = getattr(model, "config", None)
        if config is not None and hasattr(config, "to_json_string"):
            self.tb_writer.add_text("model_config", config.to_json_string())

    def on_log(self, args, state, control, logs=None, rank_stats=None, **kwargs):
        if self.tb_writer is None:
            self._open(args)
        self._scalars({**(logs or {}), **rank_metrics(rank_stats)}, state.global_step)
        if not self._in_train:  # trainer.evaluate() / predict() after training: out now, to the same event file
            self._upload(force=True)  # (closing here made the event's second report open a third file)

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        # HF reports evaluations through on_log; here they also arrive as their own event.
        self.on_log(args, state, control, logs=metrics)

    def on_restart(self, args, state, control, **kwargs):
        if self.tb_writer is not None:  # steps after the checkpoint are replayed
            self._purge_from(state.global_step + 1)

    def _purge_from(self, step: int):
        """TensorBoard hides points at or after `step` written before this SessionLog START (torch's
        SummaryWriter(purge_step=...) writes the same event, but only when it opens its file)."""
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog

        self.tb_writer._get_file_writer().add_event(Event(step=step, session_log=SessionLog(status=SessionLog.START)))
        self._written = {key for key in self._written if key[0] < step}

    def on_save(self, args, state, control, **kwargs):
        if self.tb_writer is not None:
            self.tb_writer.flush()
            self._upload()

    def on_train_end(self, args, state, control, metrics=None, **kwargs):
        self._in_train = False
        if self.tb_writer is None:
            return
        self._scalars(metrics, state.global_step)  # the run's summary (train_runtime, ...), as HF logs it
        self._close()

    def _close(self):
        self.tb_writer.close()
        self.tb_writer = None
        self._upload(force=True)
        if self._staging is not None:
            shutil.rmtree(self._staging, ignore_errors=True)
            self._staging = None
