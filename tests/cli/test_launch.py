"""`raytrainer launch`'s command line (raytrainer/cli/launch.py): its options, the elastic N-M spelling, and the
options turned into HostedOptions in one step (what the launch does with them: tests/hosting/)."""

from __future__ import annotations

import pytest

from raytrainer.arguments.scaling import parse_workers
from raytrainer.hosting.options import HostedOptions


def test_elastic_workers_spelled_as_torchrun_does():
    assert parse_workers("2-4") == (2, 4)
    assert parse_workers("2") == 2


def test_launch_help_names_the_options(capsys):
    from raytrainer.cli.commands import main

    with pytest.raises(SystemExit):
        main(["launch", "--help"])
    out = capsys.readouterr().out
    for option in ("--num_workers", "--max_failures", "--storage_options", "--fresh", "SCRIPT"):
        assert option in out


def test_raytrainer_launch_builds_the_options_from_its_command_line_in_one_step(monkeypatch):
    """The options before SCRIPT become HostedOptions (those not given keep their defaults), the rest is the
    script's own; --fresh is resume=False."""
    from raytrainer.cli import commands
    from raytrainer.hosting import launch_script

    seen = {}

    def fake_launch(script, script_args, options, reporters_named=False):
        seen.update(script=script, script_args=list(script_args), options=options, reporters_named=reporters_named)
        return None

    monkeypatch.setattr(launch_script, "launch_script", fake_launch)
    assert commands.main(["launch", "--num_workers", "2", "--max_failures", "3", "--storage_options",
                          "client_kwargs.region_name=eu", "--fresh", "--use_gpu", "false", "train.py", "--lr",
                          "1e-4"]) == 0
    options = seen["options"]
    assert (seen["script"], seen["script_args"], seen["reporters_named"]) == ("train.py", ["--lr", "1e-4"], False)
    assert (options.num_workers, options.max_failures, options.use_gpu, options.resume) == (2, 3, False, False)
    assert options.storage_options == {"client_kwargs": {"region_name": "eu"}}
    assert options.worker_idle_timeout_s == HostedOptions().worker_idle_timeout_s
    assert commands.main(["launch", "--report_to", "none", "--run_name", "sft", "train.py"]) == 0
    assert seen["reporters_named"] is True and seen["options"].resume is True


@pytest.mark.parametrize("flags, fix", [
    (["--nproc_per_node", "2"], "use --num_workers N"),
    (["--nproc-per-node=2"], "use --num_workers N"),
    (["--nnodes", "2"], "give --num_workers"),
    (["--master_port", "29500"], "Ray Train makes the process group"),
    (["--standalone"], "a local Ray starts by itself"),
])
def test_torchruns_own_flags_are_refused_naming_what_to_write(flags, fix, capsys):
    """A user moving from `torchrun --nproc_per_node 2 train.py` types torchrun's flags: each is named with the
    fix (argparse's exit 2), never taken for another option; after SCRIPT they stay the script's."""
    from raytrainer.cli import commands

    with pytest.raises(SystemExit) as exit_:
        commands.main(["launch", *flags, "train.py"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert f"{flags[0].split('=')[0]} is torchrun's option" in err and fix in err


def test_torchrun_flags_after_the_script_are_the_scripts(monkeypatch):
    from raytrainer.cli import commands
    from raytrainer.hosting import launch_script

    seen = {}
    monkeypatch.setattr(launch_script, "launch_script", lambda script, script_args, options, reporters_named=False:
                        seen.update(script_args=list(script_args)))
    assert commands.main(["launch", "--num_workers", "2", "train.py", "--nnodes", "3", "--standalone"]) == 0
    assert seen["script_args"] == ["--nnodes", "3", "--standalone"]
