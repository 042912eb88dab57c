"""The driver's answer to a hosted Trainer's claim of its output_dir (raytrainer/hosting/hosted_handler.py): the
lease, and the checkpoint to resume from — the newest intact one this same Trainer wrote, damage passed over by name.
Checkpoints here are committed as the workers commit them (checkpoint/hf_dirs.py), on local disk and on S3."""

from __future__ import annotations

import pytest

from raytrainer import TrainingArguments
from raytrainer.callbacks.base import CallbackHandler
from raytrainer.checkpoint import hf_dirs, lease
from raytrainer.checkpoint.damage import CheckpointDamagedError
from raytrainer.hosting.hosted_handler import HostedHandler
from raytrainer.protocol import HostedClaim
from raytrainer.state import TrainerState
from raytrainer.storage import get_fs, join
from raytrainer.storage.integrity import of_bytes

SFT = "trl.trainer.sft_trainer.SFTTrainer"
DPO = "trl.trainer.dpo_trainer.DPOTrainer"
FILES = (("model.safetensors", 4096), ("optimizer.pt", 2048), ("rng_state_0.pth", 64), ("rng_state_1.pth", 64),
         ("trainer_state.json", 32))


def write_checkpoint(output_dir: str, step: int, options=None, trainer: str = SFT, index: int = 0,
                     commit: bool = True, run: str = "run-0") -> str:
    """A checkpoint as HF writes one (model, optimizer, two ranks' rng states), committed as a hosted run does."""
    url = join(output_dir, f"checkpoint-{step}")
    fs, path = get_fs(url, options)
    fs.makedirs(path, exist_ok=True)
    sizes, checksums = {}, {}
    for name, size in FILES:
        data = bytes([step % 251]) * size
        with fs.open(f"{path}/{name}", "wb") as f:
            f.write(data)
        sizes[name], checksums[name] = size, of_bytes(data)
    if commit:
        hf_dirs.commit(url, step, [(sizes, checksums)], options, written_by={"trainer": trainer, "index": index,
                                                                      "run": run})
    return url


def damage(url: str, name: str, options=None, truncate: bool = False):
    fs, path = get_fs(join(url, name), options)
    data = fs.cat_file(path)
    with fs.open(path, "wb") as f:
        f.write(data[: len(data) // 2] if truncate else bytes([255]) * len(data))  # same size: only a checksum tells


def handler(run_id="run-a", resume=True, options=None) -> HostedHandler:
    callbacks = CallbackHandler([], TrainingArguments(output_dir="placeholder"), TrainerState())
    return HostedHandler(callbacks, run_id, resume, options, reporters_named=True)


@pytest.fixture
def store(output_url):
    return output_url


def test_resumes_from_the_newest_intact_checkpoint_of_the_same_trainer(store, capsys):
    output_dir, options = store
    for step in (3, 6, 9):
        write_checkpoint(output_dir, step, options)
    write_checkpoint(output_dir, 12, options, trainer=DPO)  # another Trainer of the script, same output_dir
    damage(join(output_dir, "checkpoint-9"), "model.safetensors", options)  # same size
    damage(join(output_dir, "checkpoint-6"), "rng_state_1.pth", options, truncate=True)
    claim = HostedClaim(output_dir=output_dir, trainer=SFT, index=0)
    chosen = handler(options=options).choose_checkpoint(claim)
    assert chosen == join(output_dir, "checkpoint-3")
    err = capsys.readouterr().err
    assert "SFTTrainer resumes from checkpoint-3 (step 3)" in err
    assert "checkpoint-9 (model.safetensors: its content changed" in err
    assert "checkpoint-6 (rng_state_1.pth:" in err


def test_a_partial_checkpoint_is_removed_and_said(store, capsys):
    output_dir, options = store
    write_checkpoint(output_dir, 3, options)
    write_checkpoint(output_dir, 6, options, commit=False)  # the write a lost worker never finished
    chosen = handler(options=options).choose_checkpoint(HostedClaim(output_dir, SFT, 0))
    assert chosen == join(output_dir, "checkpoint-3")
    assert "removed 1 unfinished checkpoint(s)" in capsys.readouterr().err
    fs, path = get_fs(join(output_dir, "checkpoint-6"), options)
    assert not fs.exists(path)


def test_checkpoints_of_another_trainer_are_not_resumed(tmp_path, capsys):
    output_dir = str(tmp_path / "run")
    write_checkpoint(output_dir, 4, trainer=SFT, index=0)
    assert handler().choose_checkpoint(HostedClaim(output_dir, DPO, 1)) is None
    assert "DPOTrainer starts from step 0: the checkpoints under" in capsys.readouterr().err
    moved = handler().choose_checkpoint(HostedClaim(output_dir, SFT, 1))
    assert moved == join(output_dir, "checkpoint-4")  # moved: itself
    write_checkpoint(output_dir, 2, trainer=SFT, index=1)  # a second SFTTrainer of the script writes here too
    assert handler().choose_checkpoint(HostedClaim(output_dir, SFT, 1)) == join(output_dir, "checkpoint-2")
    assert handler().choose_checkpoint(HostedClaim(output_dir, SFT, 0)) == join(output_dir, "checkpoint-4")


def test_resume_off_and_explicit_requests(tmp_path):
    output_dir = str(tmp_path / "run")
    newest = write_checkpoint(output_dir, 4)
    assert handler(resume=False).choose_checkpoint(HostedClaim(output_dir, SFT, 0)) is None
    assert handler().choose_checkpoint(HostedClaim(output_dir, SFT, 0, requested=False)) is None
    assert handler(resume=False).choose_checkpoint(HostedClaim(output_dir, SFT, 0, requested=True)) == newest
    assert handler().choose_checkpoint(HostedClaim(output_dir, SFT, 0, requested=newest)) == newest
    plain = tmp_path / "hf-folder"  # written by HF without raytrainer: handed to HF as it is
    plain.mkdir()
    assert handler().choose_checkpoint(HostedClaim(output_dir, SFT, 0, requested=str(plain))) == str(plain)
    damage(newest, "optimizer.pt")
    with pytest.raises(CheckpointDamagedError, match="optimizer.pt: its content changed"):
        handler().choose_checkpoint(HostedClaim(output_dir, SFT, 0, requested=newest))
    empty = str(tmp_path / "empty")
    with pytest.raises(Exception, match="resume_from_checkpoint=True, but .* holds no intact checkpoint"):
        handler().choose_checkpoint(HostedClaim(empty, SFT, 0, requested=True))


def test_the_claim_takes_the_lease_once_and_a_second_run_is_refused(tmp_path):
    output_dir = str(tmp_path / "run")
    first = handler(run_id="run-a")
    try:
        assert first.answer_claim(HostedClaim(output_dir, SFT, 0)).error is None
        assert first.answer_claim(HostedClaim(output_dir, SFT, 0)).error is None  # a restarted group claims again
        lease.check_held(output_dir, "run-a")
        refused = handler(run_id="run-b").answer_claim(HostedClaim(output_dir, SFT, 0))
        assert refused.resume_from is None and "is being written by another run" in refused.error
    finally:
        first.close()
    assert handler(run_id="run-c").answer_claim(HostedClaim(output_dir, SFT, 0)).error is None


def test_a_fresh_job_restarts_from_its_own_checkpoints_and_is_the_newest_after(tmp_path, capsys):
    """`--fresh` starts the job over, not each restart: a second claim of the same Trainer in the job (the group
    was replaced) continues from what this job committed; and the next run resumes from the fresh run's last
    checkpoint, not from the longer old run's higher step."""
    output_dir = str(tmp_path / "run")
    write_checkpoint(output_dir, 30, run="old")
    fresh = handler(run_id="new", resume=False)
    claim = HostedClaim(output_dir, SFT, 0)
    assert fresh.answer_claim(claim).resume_from is None  # the first start: afresh
    mine = write_checkpoint(output_dir, 10, run="new")
    assert fresh.answer_claim(claim).resume_from == mine  # a restart of the same job: its own, not the old run's
    fresh.close()
    assert handler(run_id="next").choose_checkpoint(claim) == mine  # committed last: the newest
    assert "resumes from checkpoint-10 (step 10)" in capsys.readouterr().err


def test_the_best_checkpoint_is_fetched_with_the_one_resumed(tmp_path):
    """load_best_model_at_end reads the best checkpoint at the end: a new node must have it too."""
    output_dir = "file://" + str(tmp_path / "run")
    best = write_checkpoint(output_dir, 3)
    newest = write_checkpoint(output_dir, 6)
    fs, path = get_fs(join(newest, "trainer_state.json"))
    with fs.open(path, "w") as f:
        f.write('{"best_model_checkpoint": "/tmp/raytrainer-staging/abc/checkpoint-3"}')
    from raytrainer.checkpoint.manifest import _checksum  # the state file changed: commit it again
    hf_dirs.commit(newest, 6, [({n: fs.size(f"{path.rsplit('/', 1)[0]}/{n}") for n, _ in FILES},
                                {n: _checksum(join(newest, n), None) for n, _ in FILES})], None,
                   written_by={"trainer": SFT, "index": 0, "run": "run-0"})
    assert handler().best_checkpoint_of(newest) == (best,)
    assert handler().best_checkpoint_of(best) == ()
