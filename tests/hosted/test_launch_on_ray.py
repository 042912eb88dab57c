"""`raytrainer launch` on the session's Ray: an unmodified transformers script (plain_script.py) on 2 workers,
its checkpoints committed, a lost worker and a killed driver survived, a damaged newest checkpoint passed over;
each run ends with the weights of the uninterrupted one."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

import raytrainer
from raytrainer.checkpoint.listing import list_checkpoints
from raytrainer.storage import join

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plain_script.py")
OPTIONS = dict(num_workers=2, disable_tqdm=True)


def launch(output_dir: str, results: str, *extra: str, **options):
    return raytrainer.launch(SCRIPT, ["--output_dir", output_dir, "--results", results, *extra],
                             **{**OPTIONS, **options})


def assert_same_run(results: str, reference: str):
    """Every logged loss (rel 1e-5) and the final weights (1e-6) equal to the reference run's."""
    def losses(folder):
        with open(os.path.join(folder, "log_history.json")) as f:
            return {h["step"]: h["loss"] for h in json.load(f) if "loss" in h}

    got, want = losses(results), losses(reference)
    assert got.keys() == want.keys()
    for step, loss in want.items():
        assert got[step] == pytest.approx(loss, rel=1e-5), f"step {step}"
    a, b = load_file(os.path.join(results, "weights.safetensors")), load_file(os.path.join(reference,
                                                                                         "weights.safetensors"))
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-6, msg=name)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, ray_session):
    root = tmp_path_factory.mktemp("uninterrupted")
    result = launch(str(root / "run"), str(root / "results"))
    assert [r["global_step"] for r in result.runs] == [8]
    return str(root / "run"), str(root / "results")


def test_checkpoints_are_committed_with_every_rank_files(uninterrupted):
    output_dir, _ = uninterrupted
    infos = list_checkpoints(output_dir)
    assert [(os.path.basename(i.url), i.committed) for i in infos] == [
        ("checkpoint-3", True), ("checkpoint-6", True), ("checkpoint-8", True)]
    with open(os.path.join(output_dir, "checkpoint-8", "COMMITTED")) as f:
        manifest = json.load(f)
    assert {"rng_state_0.pth", "rng_state_1.pth", "model.safetensors", "optimizer.pt"} <= set(manifest["files"])
    assert manifest["written_by"]["trainer"] == "transformers.trainer.Trainer"
    assert manifest["written_by"]["index"] == 0 and manifest["written_by"]["run"]  # the job that wrote it
    assert not os.path.exists(os.path.join(output_dir, ".raytrainer-lease.json"))  # released with the job


def test_a_lost_worker_resumes_by_itself_on_s3(uninterrupted, s3_bucket, s3_server, tmp_path):
    """Rank 1 is killed at step 5; Ray Train replaces the group, the script runs again on it and its Trainer
    resumes from checkpoint-3 on S3 (fetched, checked, HF's own resume)."""
    url = s3_bucket + "/hosted-run"
    result = launch(url, str(tmp_path / "results"), "--kill_at", "5", "--kill_marker", str(tmp_path / "killed"),
                    max_failures=1, storage_options=dict(s3_server.storage_options))
    assert os.path.exists(tmp_path / "killed") and result.runs[-1]["global_step"] == 8
    assert_same_run(str(tmp_path / "results"), uninterrupted[1])
    infos = list_checkpoints(url, dict(s3_server.storage_options))
    assert [(os.path.basename(i.url), i.committed) for i in infos] == [
        ("checkpoint-3", True), ("checkpoint-6", True), ("checkpoint-8", True)]


def test_the_same_command_resumes_after_the_driver_was_killed_passing_a_damaged_checkpoint_by_name(
        uninterrupted, join_session_ray, tmp_path, capfd):
    """The driver (`raytrainer launch`) is killed while rank 0 sits in step 8's save: checkpoint-3 and checkpoint-6
    are committed, checkpoint-8 is not. Then the newest committed one, checkpoint-6, is damaged (its weights
    file cut in half). The same run again removes the unfinished one, says so, takes over the lease of the dead
    driver, passes over the damaged one by name and resumes from checkpoint-3. (The damaged checkpoint was a test
    of its own, with a launch more.)"""
    output_dir, results = str(tmp_path / "run"), str(tmp_path / "results")
    command = [sys.executable, "-m", "raytrainer", "launch", "--num_workers", "2", "--disable_tqdm", SCRIPT,
               "--output_dir", output_dir, "--results", results]
    first = subprocess.Popen(command + ["--pause_at", "8", "--pause_s", "120"], env=join_session_ray,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not os.path.isdir(os.path.join(output_dir, "checkpoint-8")):
            assert first.poll() is None and time.monotonic() < deadline, "the first run never reached step 8"
            time.sleep(0.5)
        time.sleep(1.0)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
    assert [(os.path.basename(i.url), i.committed) for i in list_checkpoints(output_dir)] == [
        ("checkpoint-3", True), ("checkpoint-6", True), ("checkpoint-8", False)]
    model = os.path.join(output_dir, "checkpoint-6", "model.safetensors")
    with open(model, "r+b") as f:
        f.truncate(os.path.getsize(model) // 2)
    # The same command again, as raytrainer.launch in this process (the command line was the first's): the lease
    # of the dead driver is taken over, the unfinished checkpoint removed, the damaged one passed over.
    launch(output_dir, results)
    err = capfd.readouterr().err
    assert "removed 1 unfinished checkpoint(s)" in err and "checkpoint-8" in err
    assert "passed over checkpoint-6 (model.safetensors" in err
    assert "Trainer resumes from checkpoint-3 (step 3)" in err
    assert_same_run(results, uninterrupted[1])
    assert join(output_dir, "checkpoint-8") == list_checkpoints(output_dir)[-1].url
    # The rerun's step 6 did not write over the damaged checkpoint: it was set aside first, as docs/checkpoints.md
    # says, cut in half as it was, and the new checkpoint-6 is committed.
    aside = os.path.join(output_dir, "checkpoint-6.damaged", "model.safetensors")
    assert os.path.getsize(aside) < os.path.getsize(model)
    assert ("checkpoint-6", True) in [(os.path.basename(i.url), i.committed) for i in list_checkpoints(output_dir)]
