"""No credential in any log at any log_level (issue 20, 5): a run on S3 at log_level='debug', with the root
logger at DEBUG, writes neither the access key id, the secret nor the session token: not on the driver's
console, not in its log records, not in Ray's session log files."""

from __future__ import annotations

import glob
import logging
import os

import pytest

from raytrainer import Trainer
from tests.models import TokenData, make_model
from tests.resume_script import training_args

KEY, SECRET, TOKEN = "AKIARAYTRAINERLEAK01", "rtSecretLeakCanary0123456789abcdef", "rtTokenLeakCanaryFwoGZXIvYXdzEJr"


def _options(s3_server) -> dict:
    return {**s3_server.storage_options, "key": KEY, "secret": SECRET, "token": TOKEN}


def _leaks(text: str) -> list:
    return [s for s in (KEY, SECRET, TOKEN) if s in text]


def test_the_grep_would_see_a_leak(s3_server, s3_bucket, caplog):
    """The canary works: botocore at DEBUG does write the key id and the token (what the filter stops)."""
    import s3fs

    caplog.set_level(logging.DEBUG)
    logging.getLogger("botocore").setLevel(logging.DEBUG)
    try:
        s3fs.S3FileSystem(skip_instance_cache=True, **_options(s3_server)).ls(s3_bucket)
    finally:
        logging.getLogger("botocore").setLevel(logging.INFO)
    assert KEY in caplog.text and TOKEN in caplog.text


def test_debug_run_in_process_logs_no_credential(s3_server, s3_bucket, caplog, capfd):
    caplog.set_level(logging.DEBUG)  # the user's root logger at DEBUG, as logging.basicConfig(level=DEBUG)
    args = training_args(s3_bucket + "/run", _options(s3_server), log_level="debug")
    args.max_steps = 4
    Trainer(model=make_model(), args=args, train_dataset=TokenData(44)).train()
    out, err = capfd.readouterr()
    assert logging.getLogger().level == logging.DEBUG  # root at DEBUG; the storage clients held at INFO
    assert logging.getLogger("botocore.endpoint").getEffectiveLevel() == logging.INFO
    assert _leaks(caplog.text + out + err) == []


@pytest.mark.usefixtures("ray_session")
def test_debug_run_on_ray_logs_no_credential(s3_server, s3_bucket, capfd):
    import ray

    args = training_args(s3_bucket + "/ray-run", _options(s3_server), num_workers=1, log_level="debug")
    args.max_steps = 4
    Trainer(model=make_model(), args=args, train_dataset=TokenData(44)).train()
    out, err = capfd.readouterr()
    assert _leaks(out + err) == []
    logs = ray._private.worker._global_node.get_logs_dir_path()
    leaked = []
    for path in glob.glob(os.path.join(logs, "**", "*"), recursive=True):
        if os.path.isfile(path):
            with open(path, "rb") as f:
                text = f.read().decode("utf-8", "replace")
            leaked += [(os.path.basename(path), s) for s in _leaks(text)]
    assert leaked == []
