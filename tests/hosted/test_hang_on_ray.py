"""A hung rank in the hosted mode (plain_script.py under `raytrainer launch` on the session's Ray, 2 workers): rank
1 sleeps in a callback at the end of step 5. Its watchdog names it with the line it is stuck on after
hang_warning_s (rank 0, waiting in HF's gather, is named as waiting for another rank); the log lines of the steps
before the stall reach the console first; after hang_timeout_s the group restarts from checkpoint-3 (one failure
against max_failures) and the run ends at step 8, its trainer_state.json recording the restart and its cause,
as the own loop's does."""

from __future__ import annotations

import json
import os
import re

import raytrainer

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plain_script.py")


def test_a_hung_rank_is_named_then_its_group_restarts_from_the_last_checkpoint(tmp_path, capfd, ray_session):
    marker = tmp_path / "hung"
    result = raytrainer.launch(SCRIPT, ["--output_dir", str(tmp_path / "run"), "--results", str(tmp_path / "res"),
                                        "--hang_at", "5", "--hang_s", "600", "--hang_marker", str(marker)],
                               num_workers=2, disable_tqdm=True, max_failures=1, hang_warning_s=3,
                               hang_timeout_s=12)
    assert marker.exists() and result.runs[-1]["global_step"] == 8
    captured = capfd.readouterr()
    err, out = captured.err, captured.out + captured.err
    stalled = re.search(r"rank 1 has made no progress for \d+ s in (.*)", err)
    assert stalled, err[-3000:]
    assert "on_step_end" in stalled.group(1) and "plain_script.py:" in stalled.group(1)  # the hung line
    assert re.search(r"rank 0 has made no progress for \d+ s in .*waiting for another rank", err), err[-3000:]
    assert "Trainer resumes from checkpoint-3 (step 3)" in out
    assert re.search(r"worker group restarted with 2 workers at step 3 from checkpoint-3 \(hang\): rank 1 made no "
                     r"progress", out), out[-3000:]  # the driver's line of the restart
    with open(tmp_path / "run" / "checkpoint-8" / "trainer_state.json") as f:
        restarts = json.load(f)["stateful_callbacks"]["raytrainer"]["restarts"]
    assert [(r["reason"], r["global_step"], os.path.basename(r["checkpoint"]), r["world_size"]) for r in restarts] \
        == [("hang", 3, "checkpoint-3", 2)]
    assert "rank 1 made no progress" in restarts[0]["cause"] and "plain_script.py:" in restarts[0]["cause"]
