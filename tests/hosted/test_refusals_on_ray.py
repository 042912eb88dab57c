"""A claim the driver refuses on a worker's behalf (storage without credentials, an output_dir another run
writes), made as the script's Trainer is built, ends `raytrainer launch` as one line naming the fix and exit
status 2, not as the worker's traceback
wrapped in the driver's (hosting/dispatch_order.py: the handler's refusal is raised on the driver). The same
refusal, when the script is given `--output_dir` (which the driver reads), comes before Ray and the workers."""

from __future__ import annotations

import os

from raytrainer.cli.commands import main

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plain_script.py")


def test_a_refused_claim_is_one_line_and_exit_status_2(tmp_path, capfd, ray_session, monkeypatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    from raytrainer.hosting import dispatch_order

    dispatched = []
    real = dispatch_order.dispatch.dispatch_job
    monkeypatch.setattr(dispatch_order.dispatch, "dispatch_job", lambda *a, **k: dispatched.append(1) or real(*a, **k))
    for named in ("--out", "--output_dir"):  # claimed by the script's Trainer on rank 0; read by the driver
        built = tmp_path / f"built{named}"
        status = main(["launch", "--num_workers", "1", "--disable_tqdm", "--storage_options",
                       "endpoint_url=http://127.0.0.1:9", SCRIPT, named, "s3://nobucket/run", "--results",
                       str(tmp_path / "res"), "--built_marker", str(built)])
        captured = capfd.readouterr()
        err = captured.err
        assert status == 2, named
        errors = [line for line in err.splitlines() if line.startswith("raytrainer: error:")]
        assert len(errors) == 1 and "No usable credentials for s3://nobucket/run" in errors[0], named
        assert "storage_options" in errors[0]  # the fix is named
        assert "Traceback" not in err and "TrainingError" not in err
        # The job went to the workers (its Trainer claimed there) only where the driver could not read the
        # output_dir.
        assert len(dispatched) == 1, (named, dispatched)
        # Refused as the Trainer was built (its lease-only claim), not at its train(): the script's next line,
        # which writes the marker, never ran.
        assert not built.exists(), named
