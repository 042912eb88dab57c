"""Nothing committed is lost, nothing uncommitted is read, and a resumed run ends where an uninterrupted one
does: a crash before a commit, a SIGKILLed driver, an exception mid-run. Each on local disk and on S3."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from raytrainer.checkpoint.listing import list_checkpoints, newest_committed
from tests.models import assert_same_weights, weights
from tests.resume_script import STEPS, SlowTrainer, TokenData, collator, make_model, training_args
from tests.support import ROOT


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return _uninterrupted(tmp_path_factory, random=False)


@pytest.fixture(scope="module")
def uninterrupted_random(tmp_path_factory):
    """The reference with dropout and a random collator (resume_script --random)."""
    return _uninterrupted(tmp_path_factory, random=True)


def _uninterrupted(tmp_path_factory, random: bool):
    out = tmp_path_factory.mktemp("ref")
    SlowTrainer.seen_path = str(out / "seen.jsonl")
    trainer = SlowTrainer(model=make_model(random), args=training_args(str(out / "run"), save_strategy="no"),
                          train_dataset=TokenData(44), data_collator=collator(random))
    trainer.train()
    SlowTrainer.seen_path = None
    return weights(trainer.model), _seen(out / "seen.jsonl")


def _seen(path):
    with open(path) as f:
        return {r["step"]: r["idx"] for r in map(json.loads, f)}


def _script(output_dir, result, storage_options, *extra, wait=True, env=None):
    cmd = [sys.executable, "-m", "tests.resume_script", output_dir, str(result)]
    if storage_options:
        cmd += ["--storage-options", json.dumps(storage_options)]
    cmd += list(extra)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if wait:
        proc.wait(timeout=300)
    return proc


def test_crash_before_commit_then_a_sigkilled_rerun_then_resume_end_exact(output_url, tmp_path,
                                                                          uninterrupted_random):
    """With dropout and a random collator, three drivers on one output_dir: the first crashes after checkpoint-8's
    files and before its commit (a partial checkpoint, never resumed); the second resumes from checkpoint-4 and is
    killed with SIGKILL once it has committed a checkpoint of its own; the third resumes from that one. The runs
    after the crash continue the streams exactly: every step from 5 saw the uninterrupted run's samples, and the
    weights end equal. (The crash and the SIGKILLed driver were two tests, with a driver each more.)"""
    output_dir, opts = output_url
    crashed = _script(output_dir, tmp_path / "r1.pt", opts, "--crash-before-commit", "8", "--random")
    assert crashed.returncode == 17, crashed.stdout.read()
    listed = {c.step: c.committed for c in list_checkpoints(output_dir, opts)}
    assert listed == {4: True, 8: False}
    assert newest_committed(output_dir, opts).endswith("checkpoint-4")

    def committed_step():
        url = newest_committed(output_dir, opts)
        return None if url is None else int(url.rsplit("-", 1)[1])

    # 0.6 s a step: after checkpoint-8 commits, 4 steps (2.4 s) are left to kill it in, as the 8 steps at 0.3 s
    # after checkpoint-4 were for a first run.
    seen = tmp_path / "seen.jsonl"
    proc = _script(output_dir, tmp_path / "r2.pt", opts, "--resume", "--seen", str(seen), "--random",
                   "--sleep-per-step", "0.6", wait=False)
    deadline = time.time() + 120
    while (committed_step() or 0) <= 4 and time.time() < deadline:
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not os.path.exists(tmp_path / "r2.pt")
    killed_at = committed_step()
    assert 4 < killed_at < STEPS  # checkpoint-8, committed by the resumed run that was killed

    resumed = _script(output_dir, tmp_path / "r3.pt", opts, "--resume", "--seen", str(seen), "--random")
    assert resumed.returncode == 0, resumed.stdout.read()
    result = torch.load(tmp_path / "r3.pt")
    assert result["global_step"] == STEPS
    ref_weights, ref_seen = uninterrupted_random
    assert_same_weights(result["weights"], ref_weights)
    # Steps 5.. saw exactly the samples the uninterrupted run saw: the killed run's steps and the last run's
    # (a step the kill cut short is seen twice, the same samples both times).
    records = [json.loads(line) for line in open(seen)]
    assert {r["step"] for r in records} == {s for s in ref_seen if s > 4}
    assert all(r["idx"] == ref_seen[r["step"]] for r in records), records
    assert {c.step: c.committed for c in list_checkpoints(output_dir, opts)} == {4: True, 8: True, 12: True}


def test_resume_true_without_a_checkpoint_is_a_clear_error(tmp_path):
    from raytrainer import ConfigError

    trainer = SlowTrainer(model=make_model(), args=training_args(str(tmp_path / "empty")),
                          train_dataset=TokenData(44))
    with pytest.raises(ConfigError, match="holds no committed checkpoint"):
        trainer.train(resume_from_checkpoint=True)
    with pytest.raises(ConfigError, match="not a committed checkpoint"):
        trainer.train(resume_from_checkpoint=str(tmp_path / "empty" / "checkpoint-4"))


@pytest.mark.parametrize("ignore_data_skip", [False, True])
def test_resume_continues_the_epoch_or_starts_it_over_with_ignore_data_skip(tmp_path, uninterrupted,
                                                                            ignore_data_skip):
    out = str(tmp_path / "run")
    first = SlowTrainer(model=make_model(), args=training_args(out), train_dataset=TokenData(44))
    first.args.max_steps = 4
    first.train()
    seen = tmp_path / "seen.jsonl"
    SlowTrainer.seen_path = str(seen)
    try:
        resumed = SlowTrainer(model=make_model(), args=training_args(out, ignore_data_skip=ignore_data_skip),
                              train_dataset=TokenData(44))
        resumed.train(resume_from_checkpoint=True)
    finally:
        SlowTrainer.seen_path = None
    ref_seen = uninterrupted[1]
    # 44 samples in batches of 8: step 4 is mid-epoch. Skipping continues at step 5's samples; ignoring the
    # skip starts the epoch's order over (step 1's samples).
    assert _seen(seen)[5] == (ref_seen[1] if ignore_data_skip else ref_seen[5])


def test_ctrl_c_then_sigkill_of_a_two_worker_ray_driver_and_resume_end_exact(tmp_path, uninterrupted,
                                                                           join_session_ray):
    """The driver runs its own Ray job with 2 workers, on a running Ray (the session's, as a script joins a
    cluster). Ctrl-C (SIGINT): every worker saves at the next step boundary, the checkpoint commits, train()
    raises KeyboardInterrupt. The rerun with resume is killed with SIGKILL (the job's actors go with it) once a
    later checkpoint commits. Resuming that (here in one process: the same global batch) ends with the
    uninterrupted run's weights."""
    output_dir = str(tmp_path / "run")

    def committed_step():
        url = newest_committed(output_dir)
        return None if url is None else int(url.rsplit("-", 1)[1])

    def run_until_committed_after(step, *extra):
        proc = _script(output_dir, tmp_path / "never.pt", None, "--num-workers", "2", "--sleep-per-step", "0.3",
                       *extra, wait=False, env=join_session_ray)
        deadline = time.time() + 180
        while (committed_step() or 0) <= step and time.time() < deadline:
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            time.sleep(0.2)
        return proc

    interrupted = run_until_committed_after(0)
    first = committed_step()
    os.kill(interrupted.pid, signal.SIGINT)
    out, _ = interrupted.communicate(timeout=120)
    assert interrupted.returncode != 0 and "KeyboardInterrupt" in out, out[-3000:]
    stopped_at = committed_step()
    assert first < stopped_at < STEPS  # a checkpoint of its own, after the first periodic one

    killed = run_until_committed_after(stopped_at, "--resume")
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    assert stopped_at < committed_step() < STEPS and not os.path.exists(tmp_path / "never.pt")

    resumed = SlowTrainer(model=make_model(), args=training_args(output_dir), train_dataset=TokenData(44))
    assert resumed.train(resume_from_checkpoint=True).global_step == STEPS
    assert_same_weights(resumed.model.state_dict(), uninterrupted[0])
