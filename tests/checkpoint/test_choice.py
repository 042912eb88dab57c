"""The one choice of the checkpoint to resume from (raytrainer/checkpoint/choice.py), as the driver's resume, a
restarted worker group and the hosted claim make it: the filters (a named checkpoint, this run's id, a trainer's
class and index), damage passed over by name, unfinished checkpoints removed and said. Real files and manifests,
on local disk and on S3 (moto on loopback)."""

from __future__ import annotations

import json

import pytest

from raytrainer.checkpoint import manifest
from raytrainer.checkpoint.choice import choose
from raytrainer.checkpoint.damage import CheckpointDamagedError
from raytrainer.errors import ConfigError
from raytrainer.storage import get_fs, join
from raytrainer.storage.retry import Retry

SFT = "trl.trainer.sft_trainer.SFTTrainer"
DPO = "trl.trainer.dpo_trainer.DPOTrainer"


def write(output_dir: str, step: int, options=None, run: str = "run-a", commit: bool = True,
          written_by: dict | None = None) -> str:
    """checkpoint-<step>: weights and trainer_state.json (the run id where raytrainer's own loop keeps it),
    committed as a writer commits (the manifest last), or left unfinished."""
    url = join(output_dir, f"checkpoint-{step}")
    state = {"global_step": step, "stateful_callbacks": {"raytrainer": {"run_id": run}}}
    _put(url, "model.safetensors", bytes([step % 251]) * 512, options)
    _put(url, "trainer_state.json", json.dumps(state).encode(), options)
    if commit:
        manifest.commit(url, step, options, written_by=written_by)
    return url


def hosted(output_dir: str, step: int, options=None, trainer: str = SFT, index: int = 0, run: str = "run-a") -> str:
    """A checkpoint the hosted mode committed: who wrote it is in the manifest's `written_by`."""
    return write(output_dir, step, options, run=run, written_by={"trainer": trainer, "index": index, "run": run})


def _put(url: str, name: str, data: bytes, options=None):
    fs, path = get_fs(join(url, name), options)
    fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    with fs.open(path, "wb") as f:
        f.write(data)


def damage(url: str, name: str, options=None, truncate: bool = False):
    fs, path = get_fs(join(url, name), options)
    data = fs.cat_file(path)
    _put(url, name, data[: len(data) // 2] if truncate else bytes([255]) * len(data), options)  # same size: checksum


def exists(url: str, options=None) -> bool:
    fs, path = get_fs(url, options)
    return fs.exists(path)


@pytest.fixture
def store(output_url):
    return output_url


def test_newest_intact_by_step_passes_over_damage_by_name_and_leaves_it(store, capsys):
    output_dir, options = store
    for step in (2, 4, 6, 8):
        write(output_dir, step, options)
    damage(join(output_dir, "checkpoint-8"), "model.safetensors", options)  # same size: only a checksum tells
    damage(join(output_dir, "checkpoint-6"), "trainer_state.json", options, truncate=True)
    found = choose(output_dir, options, doing="resuming")
    assert (found.url, found.step) == (join(output_dir, "checkpoint-4"), 4)
    assert [d.name for d in found.damaged] == ["model.safetensors", "trainer_state.json"]
    err = capsys.readouterr().err
    assert f"resuming from checkpoint-4 (step 4) under {output_dir}; passed over checkpoint-8 (model.safetensors: " \
           "its content changed" in err
    assert "; checkpoint-6 (trainer_state.json: " in err and err.count("damaged, left in place") == 1
    assert exists(join(output_dir, "checkpoint-8"), options) and exists(join(output_dir, "checkpoint-6"), options)


def test_quiet_when_clean_and_nothing_fits(store, capsys):
    output_dir, options = store
    assert choose(output_dir, options).url is None  # no output_dir yet
    newest = write(output_dir, 3, options)
    assert choose(output_dir, options, quiet_if_clean=True).url == newest
    assert capsys.readouterr().err == ""
    damage(newest, "model.safetensors", options)
    found = choose(output_dir, options, quiet_if_clean=True)
    assert found.url is None and [d.ckpt_url for d in found.damaged] == [newest]
    assert found.passed_over().startswith("passed over checkpoint-3 (model.safetensors: its content changed")


def test_unfinished_checkpoints_are_removed_and_said_only_when_asked(store, capsys):
    output_dir, options = store
    write(output_dir, 3, options)
    unfinished = write(output_dir, 6, options, commit=False)  # the write a lost worker never finished
    assert choose(output_dir, options).url == join(output_dir, "checkpoint-3")  # passed over, kept
    assert exists(unfinished, options)
    assert choose(output_dir, options, remove_unfinished=True).url == join(output_dir, "checkpoint-3")
    assert not exists(unfinished, options)
    err = capsys.readouterr().err
    assert f"removed 1 unfinished checkpoint(s) under {output_dir}: checkpoint-6" in err


def test_a_restart_takes_this_runs_newest_from_its_trainer_state(store, capsys):
    """raytrainer's own loop records the run id in trainer_state.json: a restart never continues an earlier
    run's longer history; a checkpoint whose state cannot be read is passed over (whose it is is unknown)."""
    output_dir, options = store
    mine = write(output_dir, 4, options, run="now")
    write(output_dir, 2, options, run="now")
    write(output_dir, 30, options, run="before")
    assert choose(output_dir, options, run_id="now", doing="restarting this run").url == mine
    assert f"restarting this run from checkpoint-4 (step 4) under {output_dir}" in capsys.readouterr().err
    _put(join(output_dir, "checkpoint-30"), "trainer_state.json", b"{{{{", options)
    found = choose(output_dir, options, run_id="now")
    assert found.url == mine and found.damaged[0].name == "trainer_state.json"
    assert "cannot be read" in found.damaged[0].problem
    assert choose(output_dir, options, run_id="another").url is None


def test_a_hosted_claim_filters_by_trainer_index_and_run_and_orders_by_commit(tmp_path):
    output_dir = str(tmp_path / "run")
    hosted(output_dir, 4, trainer=SFT, index=0)
    found = choose(output_dir, trainer=DPO, index=1, by_commit_time=True)
    assert found.url is None and found.others_only == (SFT,)
    assert choose(output_dir, trainer=SFT, index=1, by_commit_time=True).url == join(output_dir, "checkpoint-4")
    second = hosted(output_dir, 2, trainer=SFT, index=1)  # a second SFTTrainer of the script writes here too
    assert choose(output_dir, trainer=SFT, index=1, by_commit_time=True).url == second
    assert choose(output_dir, trainer=SFT, index=0, by_commit_time=True).url == join(output_dir, "checkpoint-4")
    write(output_dir, 9)  # raytrainer's own loop: no written_by
    assert choose(output_dir, trainer=DPO, by_commit_time=True).others_only == ("raytrainer.Trainer", SFT)
    # A run started afresh commits lower steps after a longer earlier run: the last committed is the newest.
    fresh = hosted(output_dir, 1, trainer=SFT, index=1, run="fresh")
    assert choose(output_dir, trainer=SFT, index=1, by_commit_time=True).url == fresh
    assert choose(output_dir, trainer=SFT, index=1, run_id="run-a", by_commit_time=True).url == second


def test_a_named_checkpoint_is_that_one_or_an_error(store, tmp_path):
    output_dir, options = store
    named = write(output_dir, 4, options)
    write(output_dir, 8, options)
    assert choose(output_dir, options, named=named).url == named  # never swapped for the newest
    unfinished = write(output_dir, 12, options, commit=False)
    with pytest.raises(ConfigError, match="is not a committed checkpoint .missing, or its write never finished"):
        choose(output_dir, options, named=unfinished)
    damage(named, "model.safetensors", options)
    with pytest.raises(CheckpointDamagedError, match=r"checkpoint-4 is damaged: model\.safetensors: its content"):
        choose(output_dir, options, named=named)


def test_hf_folders_a_local_folder_without_a_manifest_is_handed_over(s3_bucket, s3_server, tmp_path):
    plain = tmp_path / "hf-folder"  # written by HF without raytrainer
    plain.mkdir()
    assert choose("unused", named=str(plain), hf_folders=True).url == str(plain)
    with pytest.raises(ConfigError, match="no such checkpoint"):
        choose("unused", named=str(tmp_path / "missing"), hf_folders=True)
    options = dict(s3_server.storage_options)
    remote = write(s3_bucket + "/run", 5, options, commit=False)
    with pytest.raises(ConfigError, match="only checkpoints a raytrainer run committed are fetched"):
        choose("unused", options, named=remote, hf_folders=True)


def test_a_worker_waits_out_a_transient_error_through_its_retry(store, monkeypatch):
    """The worker passes its Retry: a reset connection while reading a manifest costs a pause, not the run."""
    from raytrainer.checkpoint import choice

    output_dir, options = store
    newest = write(output_dir, 5, options)
    failures = []

    def flaky(url, storage_options=None):
        if not failures:
            failures.append(url)
            raise ConnectionResetError("reset by peer")
        return manifest.read_manifest(url, storage_options)

    monkeypatch.setattr(choice, "read_manifest", flaky)
    retry = Retry(timeout_s=30, storage_options=options, sleep=lambda s: None)
    assert choose(output_dir, options, run_id="run-a", retry=retry).url == newest
    assert failures == [newest]
