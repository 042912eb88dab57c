"""`raytrainer checkpoints`: a table (or JSON) of a run directory on local disk or S3; exit 2 on storage errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from raytrainer import storage
from raytrainer.checkpoint import manifest
from raytrainer.cli.commands import compact_metrics, human_size, main


@pytest.fixture
def run(store, make_checkpoint):
    make_checkpoint(store, 5, eval_loss=0.25)
    make_checkpoint(store, 10, eval_loss=0.5, best=store.join("checkpoint-5"))
    make_checkpoint(store, 15, committed=False)
    return store


def _option_args(options: dict | None) -> list[str]:
    if not options:
        return []
    args = []
    for key, value in options.items():
        text = json.dumps(value) if isinstance(value, dict) else str(value)
        args += ["--storage-option", f"{key}={text}"]
    return args


def test_table(run, capsys):
    assert main(["checkpoints", run.url, *_option_args(run.options)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == run.url
    assert lines[1].split() == ["STEP", "STATE", "SIZE", "METRICS", "MARKERS"]
    rows = {line.split()[0]: line for line in lines[2:]}
    assert rows.keys() == {"5", "10", "15"}
    assert rows["5"].split()[1] == "committed" and rows["5"].endswith("best")
    assert "eval_loss=0.25" in rows["5"] and "loss=1.95" in rows["5"] and "eval_runtime" not in rows["5"]
    assert rows["10"].endswith("newest") and "B" in rows["10"]
    assert rows["15"].split()[1] == "partial" and not rows["15"].endswith(("best", "newest"))


def test_json(run, capsys):
    assert main(["checkpoints", run.url, "--json", *_option_args(run.options)]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [(d["step"], d["committed"], d["best"], d["newest"]) for d in data] == [
        (5, True, True, False), (10, True, False, True), (15, False, False, False)]
    assert data[0]["url"] == run.join("checkpoint-5") and data[0]["metrics"]["eval_loss"] == 0.25


def test_dotted_storage_options_nest(s3_server, s3_bucket, capsys):
    ckpt = storage.join(s3_bucket, "run", "checkpoint-3")
    storage.write_bytes(storage.join(ckpt, "model.safetensors"), b"w", s3_server.storage_options)
    manifest.commit(ckpt, 3, s3_server.storage_options)
    args = ["--storage-option", f"endpoint_url={s3_server.endpoint_url}", "--storage-option", "key=testing",
            "--storage-option", "secret=testing", "--storage-option", "client_kwargs.region_name=us-east-1"]
    assert main(["checkpoints", s3_bucket + "/run", "--json", *args]) == 0
    assert [d["step"] for d in json.loads(capsys.readouterr().out)] == [3]


def test_empty_dir(tmp_path, capsys):
    assert main(["checkpoints", str(tmp_path)]) == 0
    assert "No checkpoints" in capsys.readouterr().out


def test_storage_error_exits_2_without_traceback(tmp_path, capsys):
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x")
    assert main(["checkpoints", str(not_a_dir)]) == 2
    err = capsys.readouterr().err
    assert "is a file" in err and "Traceback" not in err
    assert main(["checkpoints", "nosuchproto://bucket/run"]) == 2
    assert "nosuchproto" in capsys.readouterr().err


def test_console_exit_code(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "raytrainer", "checkpoints", "s3:/collapsed/run"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "s3://collapsed/run" in proc.stderr and "Traceback" not in proc.stderr


def test_formatting_helpers():
    assert human_size(12) == "12 B" and human_size(1536) == "1.5 KiB" and human_size(3 * 2**30) == "3.0 GiB"
    metrics = {"eval_loss": 0.123456, "eval_acc": 0.9, "eval_runtime": 1.0, "loss": 1.0, "epoch": 2.0,
               "learning_rate": 1e-4}
    assert compact_metrics(metrics) == "eval_loss=0.1235 eval_acc=0.9 loss=1 learning_rate=0.0001"


def test_damage_is_listed_as_damaged_and_checksums_are_read_with_verify(run, capsys):
    """A truncated committed checkpoint and one changed in place (same size) are `damaged`, never `partial` (which
    suggests it may be deleted) and never `newest`; the in-place change shows only with --verify. Damage listed
    is exit status 1 (a script checking a run reads it), with a line on stderr naming the steps."""
    run.write("checkpoint-10/model.safetensors", b"\xff" * 110)  # the same size: only a checksum tells
    assert main(["checkpoints", run.url, *_option_args(run.options)]) == 0  # sizes only: nothing seen yet
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["10"].split()[1] == "committed" and rows["10"].endswith("newest")
    assert main(["checkpoints", run.url, "--verify", *_option_args(run.options)]) == 1
    out, err = capsys.readouterr()
    rows = {line.split()[0]: line for line in out.splitlines()[2:]}
    assert rows["10"].split()[1] == "damaged" and "its content changed" in rows["10"]
    assert not rows["10"].endswith("newest")
    assert "1 damaged checkpoint(s) (step 10)" in err
    run.write("checkpoint-5/model.safetensors", bytes(50))  # truncated: seen by its size
    assert main(["checkpoints", run.url, *_option_args(run.options)]) == 1
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows["5"].split()[1] == "damaged" and "model.safetensors" in rows["5"] and "truncated" in rows["5"]
    assert main(["checkpoints", run.url, "--json", "--verify", *_option_args(run.options)]) == 1
    assert [d["step"] for d in json.loads(capsys.readouterr().out) if d["damaged"]] == [5, 10]


def test_consolidate_refuses_a_checkpoint_whose_bytes_changed(run, capsys):
    """Every reader verifies the manifest's checksums first: consolidate exits 2 naming the file, before it reads a
    tensor (a damaged shard would otherwise come out as NaN weights)."""
    run.write("checkpoint-10/model.safetensors", b"\xff" * 110)
    assert main(["consolidate", run.join("checkpoint-10"), *_option_args(run.options)]) == 2
    err = capsys.readouterr().err
    assert "checkpoint-10 is damaged: model.safetensors: its content changed" in err
