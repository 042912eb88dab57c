"""Storage faults in real runs (issue 20, 3-4): a 10 s S3 outage is ridden out and the run ends with the
uninterrupted weights; a bucket that vanishes or storage emptied between saves stops the run with a clear error
(never re-creating the bucket, never restarting from step 0); a second driver on one output_dir is refused
before any actor starts, naming the holder. Runs in the driver process (num_workers=0), except the last, which
checks on Ray that such an error fails the run once even with max_failures left."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from raytrainer import Trainer, TrainerCallback
from raytrainer.checkpoint import lease, listing
from raytrainer.checkpoint.damage import verify
from raytrainer.storage.errors import StorageLostError
from tests.models import assert_same_weights, weights
from tests.resume_script import SlowTrainer, TokenData, make_model, training_args
from tests.storage.faults import OutageProxy, bucket_exists, delete_bucket, empty_bucket
from tests.support import ROOT


class AfterFirstSave(TrainerCallback):
    """Runs `fault` once, when the first checkpoint has committed."""

    def __init__(self, fault):
        self.fault, self.done = fault, False

    def on_save(self, args, state, control, **kwargs):
        if not self.done:
            self.done = True
            self.fault()


def _train(output_dir, opts, callback=None, **extra):
    trainer = Trainer(model=make_model(), args=training_args(output_dir, opts, **extra), train_dataset=TokenData(44),
                      callbacks=[callback] if callback else None)
    trainer.train()
    return trainer


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return weights(_train(str(tmp_path_factory.mktemp("ref") / "run"), None, save_strategy="no").model)


def test_a_10s_outage_between_saves_is_ridden_out(s3_server, s3_bucket, uninterrupted):
    proxy = OutageProxy(s3_server.endpoint_url)
    opts = {**s3_server.storage_options, "endpoint_url": proxy.endpoint_url,
            "config_kwargs": {"connect_timeout": 1, "read_timeout": 5}}
    cut_at = []

    def outage():
        proxy.cut()
        cut_at.append(time.monotonic())
        threading.Timer(10.0, proxy.restore).start()

    trainer = _train(s3_bucket + "/run", opts, AfterFirstSave(outage), storage_retry_timeout_s=60)
    assert time.monotonic() - cut_at[0] >= 9.5  # the run waited the outage out, then finished
    assert_same_weights(weights(trainer.model), uninterrupted)
    for step in (4, 8, 12):
        assert verify(f"{s3_bucket}/run/checkpoint-{step}", opts) is None
    proxy.close()


@pytest.mark.parametrize("fault", ["bucket deleted", "bucket emptied"])
def test_lost_storage_stops_the_run_and_is_never_recreated(s3_server, s3_bucket, fault):
    opts = s3_server.storage_options
    action = delete_bucket if fault == "bucket deleted" else empty_bucket
    with pytest.raises(StorageLostError, match="never creates buckets" if fault == "bucket deleted" else
                       "lease .* is gone: the storage lost what this run wrote"):
        _train(s3_bucket + "/run", opts, AfterFirstSave(lambda: action(opts, s3_bucket)))
    assert bucket_exists(opts, s3_bucket) == (fault == "bucket emptied")
    if fault == "bucket emptied":
        assert listing.list_checkpoints(s3_bucket + "/run", opts) == []  # nothing written after the loss


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_second_driver_is_refused_naming_the_first(where, tmp_path, s3_server, s3_bucket, capfd):
    output_dir, opts = (str(tmp_path / "run"), None) if where == "local" else (s3_bucket + "/run",
                                                                               s3_server.storage_options)
    cmd = [sys.executable, "-m", "tests.resume_script", output_dir, str(tmp_path / "first.pt"),
           "--sleep-per-step", "0.5"] + (["--storage-options", json.dumps(opts)] if opts else [])
    first = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 120
        while listing.newest_committed(output_dir, opts) is None:  # the first driver holds the lease, trains
            assert first.poll() is None and time.time() < deadline, first.stdout.read()[-3000:]
            time.sleep(0.2)
        second = Trainer(model=make_model(), args=training_args(output_dir, opts), train_dataset=TokenData(44))
        with pytest.raises(lease.LeaseHeldError, match=rf"being written by another run: .*driver pid {first.pid}"):
            second.train(resume_from_checkpoint=True)
        assert second.state.global_step == 0
    finally:
        first.kill()  # SIGKILL: its lease stays behind, held by a dead process
        first.wait()
    capfd.readouterr()
    resumed = Trainer(model=make_model(), args=training_args(output_dir, opts), train_dataset=TokenData(44))
    assert resumed.train(resume_from_checkpoint=True).global_step == 12
    assert f"its driver (pid {first.pid}) is no longer running" in capfd.readouterr().err


class CountErrors(TrainerCallback):
    """Counts the worker errors the driver hears of: one per failed worker-group attempt here (one worker)."""

    def __init__(self):
        self.errors = []

    def on_error(self, args, state, control, traceback="", **kwargs):
        self.errors.append(traceback.strip().splitlines()[-1])


@pytest.mark.usefixtures("ray_session")
def test_on_ray_lost_storage_fails_once_despite_max_failures(s3_server, s3_bucket):
    opts = s3_server.storage_options
    errors = CountErrors()
    trainer = SlowTrainer(model=make_model(), args=training_args(s3_bucket + "/run", opts, num_workers=1,
                                                                 max_failures=2),
                          train_dataset=TokenData(44),
                          callbacks=[AfterFirstSave(lambda: empty_bucket(opts, s3_bucket)), errors])
    trainer.sleep_per_step = 0.5  # the driver empties the bucket well before the next save
    with pytest.raises(Exception, match="StorageLostError: This run's lease"):
        trainer.train()
    # Failed once: with max_failures=2 left, a restart would only meet the same loss (or start from step 0).
    assert len(errors.errors) == 1 and "StorageLostError" in errors.errors[0], errors.errors
