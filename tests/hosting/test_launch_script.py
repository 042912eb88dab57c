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
