"""Automatic recovery on real Ray: a worker process dies (os._exit) after the first checkpoint commits; Ray
Train restarts the worker group, every worker resumes from the newest committed checkpoint, and the run
ends with the weights of an uninterrupted one. On local disk and on S3 (moto)."""

import os
import time

import pytest

from raytrainer import Trainer, TrainerCallback, TrainingArguments
from raytrainer.checkpoint.listing import TRAINER_STATE_NAME, list_checkpoints, newest_committed
from raytrainer.checkpoint.manifest import is_committed
from raytrainer.state import TrainerState
from raytrainer.storage import join, read_text
from tests.models import TokenData, assert_same_weights, make_model, weights
from tests.support import die_once_committed

pytestmark = pytest.mark.usefixtures("ray_session")
KILL_AT = 6


class DiesOnce(Trainer):
    """Rank 1 kills its own process during step KILL_AT, once (a marker file survives the restart).
    `marker` is an instance attribute: class attributes set on the driver do not travel to the workers."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        if (self.ctx.rank == 1 and self.state.global_step + 1 == KILL_AT and not os.path.exists(self.marker)):
            # die only after the first save is committed
            die_once_committed(join(self.args.output_dir, "checkpoint-4"), self.marker, self.args.storage_options)
        return super().training_step(model, inputs, num_items_in_batch)


def args(output_dir, opts, num_workers, batch):
    return TrainingArguments(output_dir=output_dir, storage_options=opts, num_workers=num_workers,
                             per_device_train_batch_size=batch, max_steps=10, save_steps=4, learning_rate=1e-2,
                             optim="adamw_torch", logging_steps=5, disable_tqdm=True, seed=3, max_failures=1)


# S3 only: on local disk the same recovery is exercised by the next test and by tests/integration/test_ray_data.py (a
# worker killed mid-epoch resumes to the uninterrupted weights); each run costs ~25 s of the suite's 15 min.
@pytest.mark.parametrize("output_url", ["s3"], indirect=True)
def test_worker_killed_after_first_save_recovers_to_the_uninterrupted_weights(output_url, tmp_path):
    """With dropout: the restarted group continues every rank's random streams from the checkpoint. The
    reference is the same 2-worker run, uninterrupted (its dropout masks are those of 2 x 4 rows), on the
    same worker group."""
    output_dir, opts = output_url
    seen = []

    class Watch(TrainerCallback):  # runs on the driver, fed by the workers' event stream
        def on_restart(self, args, state, control, cause=None, **kwargs):
            seen.append(("restart", state.global_step, cause))

        def on_log(self, args, state, control, logs=None, **kwargs):
            seen.append(("log", logs["step"], None))

    trainer = DiesOnce(model=make_model(dropout=0.2), args=args(str(tmp_path / "ref"), None, 2, 4),
                       train_dataset=TokenData(48), callbacks=[Watch()])
    trainer.marker = str(tmp_path / "not-this-time")
    open(trainer.marker, "w").close()
    trainer.train()
    reference = weights(trainer.model)

    seen.clear()
    trainer.model, trainer.args = make_model(dropout=0.2), args(output_dir, opts, 2, 4)
    trainer.marker = str(tmp_path / "killed")
    output = trainer.train()
    assert os.path.exists(trainer.marker), "the injected failure never happened"
    assert output.global_step == 10
    assert_same_weights(weights(trainer.model), reference)

    # The restart is visible on the driver and recorded in the checkpoint's trainer_state.json.
    assert len(trainer.state.restarts) == 1
    restart = trainer.state.restarts[0]
    assert restart["global_step"] == 4 and restart["checkpoint"].endswith("checkpoint-4")
    assert "rank 1" in restart["cause"]
    restarts = [s for s in seen if s[0] == "restart"]
    assert len(restarts) == 1 and restarts[0][1] == 4 and "rank 1" in restarts[0][2]
    assert seen[-1] == ("log", 10, None)
    # The driver's history has each logged step once, although steps 5-6 ran twice.
    assert [h["step"] for h in trainer.state.log_history if "loss" in h] == [5, 10]
    final = newest_committed(output_dir, opts)
    saved = TrainerState.from_json_string(read_text(join(final, TRAINER_STATE_NAME), opts))
    assert saved.global_step == 10 and len(saved.restarts) == 1


class DiesMidSaveAfterDamage(Trainer):
    """Rank 0's checkpoint writer, once checkpoint-8 is committed, overwrites bytes inside checkpoint-8's model
    file (same size: only the checksum tells), then kills the process after writing checkpoint-10's model files,
    before the rest and the commit marker: a damaged committed checkpoint and a partial one on disk, once
    (`marker` as in DiesOnce)."""

    def _save(self, output_dir, state_dict=None, model=None):
        super()._save(output_dir, state_dict=state_dict, model=model)
        if output_dir.rstrip("/").endswith("checkpoint-10") and not os.path.exists(self.marker):
            checkpoint = join(self.args.output_dir, "checkpoint-8")
            while not is_committed(checkpoint):
                time.sleep(0.05)
            model_file = os.path.join(checkpoint, "model.safetensors")
            with open(model_file, "r+b") as f:
                f.seek(os.path.getsize(model_file) // 2)
                f.write(b"\xff" * 64)
            open(self.marker, "w").close()
            os._exit(1)


def test_a_restart_removes_a_partial_checkpoint_passes_over_a_damaged_one_and_resumes_from_the_one_before(
        tmp_path):
    """A worker dies while writing checkpoint-10, after checkpoint-8 (committed) was changed in place. The restart
    reads the newest checkpoint's checksums before loading it: checkpoint-10 was never committed, checkpoint-8's
    model file fails its checksum and is passed over; the run restarts from checkpoint-4, writes (and commits)
    8 and 10 again, and ends with the weights of an uninterrupted run. (A worker killed mid-save and a restart
    passing over a damaged checkpoint were two runs, with a kill and a group restart each.)"""
    output_dir = str(tmp_path / "run")
    reference = Trainer(model=make_model(), args=args(str(tmp_path / "ref"), None, 0, 8),
                        train_dataset=TokenData(48))
    reference.train()

    trainer = DiesMidSaveAfterDamage(model=make_model(), args=args(output_dir, None, 2, 4),
                                     train_dataset=TokenData(48))
    trainer.marker = str(tmp_path / "killed")
    trainer.train()
    assert os.path.exists(trainer.marker), "the injected failure never happened"
    assert [r["checkpoint"].rsplit("/", 1)[1] for r in trainer.state.restarts] == ["checkpoint-4"]
    assert {c.step: c.committed for c in list_checkpoints(output_dir)} == {4: True, 8: True, 10: True}
    assert_same_weights(weights(trainer.model), weights(reference.model))
