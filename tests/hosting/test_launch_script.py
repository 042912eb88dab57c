"""`raytrainer.launch(script, ...)` (raytrainer/hosting/launch_script.py): the script is read and parsed before any
worker starts; with num_workers=0 it runs once in this process, without Ray, its checkpoints still committed."""

from __future__ import annotations

import pytest

import raytrainer
from raytrainer.errors import ConfigError
from raytrainer.hosting.launch_script import read_script
from tests.support import ROOT


def test_launch_refuses_a_missing_script_and_one_that_does_not_parse(tmp_path):
    with pytest.raises(ConfigError, match="is not a file"):
        read_script(str(tmp_path / "missing.py"))
    broken = tmp_path / "broken.py"
    broken.write_text("import os\n\ndef main(:\n    pass\n")
    with pytest.raises(ConfigError, match=r"broken.py:3: .*does not parse"):
        read_script(str(broken))


def test_num_workers_0_runs_the_script_in_this_process_without_ray(tmp_path, monkeypatch):
    """`raytrainer launch --num_workers 0`: the script once, here (a debugger works), still committed."""
    import os

    from raytrainer.checkpoint.listing import list_checkpoints
    from raytrainer.coordinator import cluster

    monkeypatch.setattr(cluster, "connect", lambda *a, **k: pytest.fail("Ray was asked for"))
    script = os.path.join(ROOT, "tests", "hosted", "plain_script.py")
    result = raytrainer.launch(script, ["--output_dir", str(tmp_path / "run"), "--results", str(tmp_path / "res"),
                                        "--max_steps", "4"], num_workers=0, disable_tqdm=True)
    assert [r["global_step"] for r in result.runs] == [4]
    assert [(i.step, i.committed) for i in list_checkpoints(str(tmp_path / "run"))] == [(3, True), (4, True)]


def test_the_scripts_output_dir_is_probed_and_leased_before_ray_starts(tmp_path, monkeypatch):
    """`--output_dir` (HF's scripts' argument) is known before the script runs: an output_dir another run writes
    is refused here, before Ray, the workers and the script's top (a second driver: one line at once)."""
    import os

    from raytrainer.checkpoint import lease
    from raytrainer.coordinator import cluster
    from raytrainer.errors import StorageError
    from raytrainer.hosting.launch_script import named_output_dir

    assert named_output_dir(["--max_steps", "4", "--output_dir", "run"]) == os.path.abspath("run")
    assert named_output_dir(["--output_dir=s3://b/run"]) == "s3://b/run"
    assert named_output_dir(["--output_dir"]) is None and named_output_dir(["--output_root", "x"]) is None

    monkeypatch.setattr(cluster, "connect", lambda *a, **k: pytest.fail("Ray was asked for"))
    script = os.path.join(ROOT, "tests", "hosted", "plain_script.py")
    held = lease.acquire(str(tmp_path / "run"), "another-run", heartbeat=False)
    try:
        with pytest.raises(StorageError, match="is being written by another run"):
            raytrainer.launch(script, ["--output_dir", str(tmp_path / "run")], num_workers=2, disable_tqdm=True)
    finally:
        held.release()
