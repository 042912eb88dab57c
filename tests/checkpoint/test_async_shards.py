"""FSDP checkpoints written in the background (save_async=True): DCP's async_save on every rank, the commit
only after every rank's write finished. A committed one resumes at another world size; a worker that fails or
dies in the middle of its background write leaves the previous checkpoint the newest committed one, and the
restarted group resumes from it to the uninterrupted run's weights (both failures in one run, one after the
other: the two runs before cost a run and a group restart each). Real Ray, 2 workers, FSDP over gloo."""

import json
import os

import pytest

from raytrainer import Trainer
from raytrainer.checkpoint import async_shards
from raytrainer.checkpoint.listing import list_checkpoints
from raytrainer.storage import join, read_text
from raytrainer.storage.integrity import ALGORITHM
from tests.blocks_model import blocks_args, make_blocks, train_blocks
from tests.models import TokenData, assert_same_weights, weights

pytestmark = pytest.mark.usefixtures("ray_session")

# 24 samples, global batch 4 (2 workers x 2, or 1 worker x 2 x accumulation 2); a constant learning rate.
COMMON = dict(strategy="fsdp", lr_scheduler_type="constant", per_device_train_batch_size=2, save_async=True,
              save_strategy="steps", save_steps=2)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted 2-worker run, saving checkpoint-2, -4 and -6 in the background."""
    output_dir = str(tmp_path_factory.mktemp("async-fsdp") / "reference")
    return weights(train_blocks(output_dir, **COMMON).model), output_dir


def test_async_fsdp_checkpoint_is_committed_and_resumes_at_one_worker(reference, tmp_path):
    final, ref_dir = reference
    assert {c.step: c.committed for c in list_checkpoints(ref_dir)} == {2: True, 4: True, 6: True}
    manifest = json.loads(read_text(join(ref_dir, "checkpoint-2", "COMMITTED")))
    for directory in ("pytorch_model_fsdp_0", "optimizer_0"):  # both ranks' shards, each with its checksum
        for name in (f"{directory}/__0_0.distcp", f"{directory}/__1_0.distcp", f"{directory}/.metadata"):
            assert name in manifest["files"] and manifest["checksums"][name].startswith(ALGORITHM + ":")

    # The state of step 2, not of a later step (the copy to CPU happens before async_save returns).
    resumed = train_blocks(str(tmp_path / "one"), num_workers=1, resume=join(ref_dir, "checkpoint-2"), **COMMON)
    assert resumed.state.global_step == 6
    assert_same_weights(weights(resumed.model), final)


class FailsMidWrite(Trainer):
    """Rank 1's DCP writer fails in the middle of a background write, in DCP's background thread, once each
    (marker files survive the restarts): checkpoint-4's writer writes its shard file, then raises; after the
    restart, checkpoint-6's writes its shard file, then kills its process. The worker processes may serve later
    tests: the patch only acts under this run's output_dir."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        patched = async_shards.dcp_writer
        if self.ctx.rank == 1 and getattr(patched, "output_dir", None) != self.args.output_dir:
            original = getattr(patched, "original", patched)  # a kept worker may hold an earlier test's patch
            async_shards.dcp_writer = _failing(original, self.args.output_dir, self.markers)
        return super().training_step(model, inputs, num_items_in_batch)


FAILURES = {"checkpoint-4": "raise", "checkpoint-6": "kill"}


def _failing(make_writer, output_dir, markers):
    def make(url, storage_options):
        writer = make_writer(url, storage_options)
        how = next((how for name, how in FAILURES.items() if url.startswith(join(output_dir, name))), None)
        marker = os.path.join(markers, how) if how else None
        if how is None or os.path.exists(marker):
            return writer
        write_data = writer.write_data

        def failing(plan, planner):
            write_data(plan, planner).wait()  # this rank's shard file is on disk: a partial checkpoint
            open(marker, "w").close()
            if how == "kill":
                os._exit(1)
            raise OSError("injected: the storage failed in the middle of the background write")

        writer.write_data = failing
        return writer

    make.original, make.output_dir = make_writer, output_dir
    return make


def test_a_failed_or_killed_background_write_leaves_the_previous_checkpoint_the_newest(reference, tmp_path):
    """One run, two failures: a write that raises (checkpoint-4), then a worker killed mid-write (checkpoint-6)."""
    final, _ = reference
    output_dir = str(tmp_path / "run")
    trainer = FailsMidWrite(model=make_blocks(), args=blocks_args(output_dir, max_failures=2, **COMMON),
                            train_dataset=TokenData(24))
    trainer.markers = str(tmp_path)  # an instance attribute travels to the workers
    trainer.train()
    for how in ("raise", "kill"):
        assert os.path.exists(str(tmp_path / how)), f"the injected failure ({how}) never happened"
    # Neither checkpoint was committed by the failed write: each restarted group resumed from the one before,
    # removed the partial checkpoint, and wrote (and committed) it again.
    assert [r["checkpoint"].rsplit("/", 1)[1] for r in trainer.state.restarts] == ["checkpoint-2", "checkpoint-4"]
    assert {c.step: c.committed for c in list_checkpoints(output_dir)} == {2: True, 4: True, 6: True}
    assert_same_weights(weights(trainer.model), final)
