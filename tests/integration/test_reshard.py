"""A checkpoint written at one world size resumes at another: FSDP's sharded (DCP) checkpoints are resharded
on load, DDP's full ones load anywhere, and the global batch the run started with is kept by changing
gradient_accumulation_steps. Each resumed run ends where the uninterrupted 2-worker run does.

Ray runs are the expensive part here, so they are shared: the uninterrupted reference run (2 workers, on
S3) also writes the checkpoint that the 2 -> 1 test resumes from.
"""

import json
import logging
import os

import pytest
import safetensors.torch

from raytrainer import ConfigError, Trainer
from raytrainer.checkpoint.listing import list_checkpoints
from raytrainer.storage import get_fs, join, read_bytes, read_text
from tests.blocks_model import blocks_args, make_blocks, train_blocks
from tests.models import TokenData, assert_same_weights, weights
from tests.s3server import create_bucket

pytestmark = pytest.mark.usefixtures("ray_session")

# 24 samples, global batch 4: 2 workers x 2, or 1 worker x 2 x accumulation 2. A constant learning rate, so
# that a run stopped at max_steps=3 is the first half of the 6-step run.
COMMON = dict(lr_scheduler_type="constant", per_device_train_batch_size=2)


@pytest.fixture(scope="module")
def s3_reference(s3_server):
    """The uninterrupted 2-worker FSDP run, saving checkpoint-3 and checkpoint-6 to S3."""
    output_dir, opts = create_bucket(s3_server) + "/reference", dict(s3_server.storage_options)
    trainer = train_blocks(output_dir, strategy="fsdp", save_strategy="steps", save_steps=3,
                           storage_options=opts, **COMMON)
    return weights(trainer.model), output_dir, opts


def _training_args(ckpt_url, opts):
    return json.loads(read_text(join(ckpt_url, "training_args.json"), opts))


def test_fsdp_checkpoint_of_2_workers_resumes_at_1_worker_on_s3(s3_reference):
    reference, ref_dir, opts = s3_reference
    ckpt = join(ref_dir, "checkpoint-3")
    fs, path = get_fs(ckpt, opts)
    shards = sorted(os.path.relpath(p, path) for p in fs.find(path))
    # Both ranks wrote their shards of the model and of the optimizer; rank 0 the rest, COMMITTED last.
    for directory in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert {f"{directory}/__0_0.distcp", f"{directory}/__1_0.distcp", f"{directory}/.metadata"} <= set(shards)
    manifest = json.loads(read_text(join(ckpt, "COMMITTED"), opts))
    assert set(manifest["files"]) == set(shards) - {"COMMITTED"}

    # The reference's last checkpoint, consolidated from S3 to S3, holds the weights the driver got back.
    from raytrainer.checkpoint.consolidate import consolidate
    exported = consolidate(join(ref_dir, "checkpoint-6"), ref_dir.rsplit("/", 1)[0] + "/exported", opts)
    assert_same_weights(safetensors.torch.load(read_bytes(exported, opts)), reference, atol=0)

    output_dir = ref_dir.rsplit("/", 1)[0] + "/two-to-one"
    resumed = train_blocks(output_dir, strategy="fsdp", num_workers=1, save_strategy="steps", save_steps=3,
                           storage_options=opts, resume=ckpt, **COMMON)
    assert resumed.state.global_step == 6
    assert_same_weights(weights(resumed.model), reference)
    # Same arguments but num_workers: the accumulation doubled to keep the global batch of 4.
    assert _training_args(join(output_dir, "checkpoint-6"), opts)["gradient_accumulation_steps"] == 2


def test_fsdp_checkpoint_of_1_worker_resumes_at_2_workers_locally(tmp_path, s3_reference):
    out = str(tmp_path / "run")
    # One process (num_workers=0): FSDP keeps the model whole but writes the same sharded format.
    train_blocks(out, strategy="fsdp", num_workers=0, gradient_accumulation_steps=2, max_steps=3,
                 save_strategy="steps", save_steps=3, **COMMON)
    # With an evaluation at step 6 on 13 samples in batches of 3 (rank 0: 3 batches, rank 1: 2): fully
    # sharded, every forward pass gathers with the other rank, so rank 1 runs a discarded third one.
    resumed = train_blocks(out, strategy="fsdp", num_workers=2, gradient_accumulation_steps=2,
                           save_strategy="steps", save_steps=3, resume=True, eval_n=13, eval_strategy="steps",
                           eval_steps=3, per_device_eval_batch_size=3, **COMMON)
    assert resumed.state.global_step == 6
    assert [h["step"] for h in resumed.state.log_history if "eval_loss" in h] == [6]
    assert_same_weights(weights(resumed.model), s3_reference[0])
    assert _training_args(join(out, "checkpoint-6"), None)["gradient_accumulation_steps"] == 1

    # A shard lost after the commit: the checkpoint is damaged (kept, never taken for partial), and resuming
    # from it is refused naming the file.
    os.remove(os.path.join(out, "checkpoint-6", "optimizer_0", "__1_0.distcp"))
    listed = {c.step: (c.committed, c.damaged) for c in list_checkpoints(out)}
    assert listed[3] == (True, None) and not listed[6][0] and "__1_0.distcp" in listed[6][1]
    with pytest.raises(ConfigError, match=r"checkpoint-6 is damaged: optimizer_0/__1_0\.distcp: missing"):
        train_blocks(out, strategy="fsdp", resume=os.path.join(out, "checkpoint-6"), **COMMON)
    assert os.path.isdir(os.path.join(out, "checkpoint-6"))


def test_ddp_checkpoint_of_2_workers_resumes_in_one_process_with_a_log_line(tmp_path, s3_reference, caplog):
    out = str(tmp_path / "run")
    train_blocks(out, strategy="ddp", max_steps=3, save_strategy="steps", save_steps=3, **COMMON)
    with caplog.at_level(logging.WARNING, logger="raytrainer"):
        resumed = train_blocks(out, strategy="ddp", num_workers=0, resume=True, **COMMON)
    assert_same_weights(weights(resumed.model), s3_reference[0])
    assert ("at world size 1 (saved at world size 2): gradient_accumulation_steps 1 -> 2, keeping the global "
            "batch of 4 samples") in caplog.text


def test_a_global_batch_that_cannot_be_kept_is_refused_before_training(tmp_path):
    out = str(tmp_path / "run")
    train_blocks(out, num_workers=0, per_device_train_batch_size=3, max_steps=1, save_strategy="steps",
                 save_steps=1)
    trainer = Trainer(model=make_blocks(), args=blocks_args(out, num_workers=2, per_device_train_batch_size=3),
                      train_dataset=TokenData(24))
    with pytest.raises(ConfigError, match=r"resuming at 2 workers: the run started with a global batch of 3 "
                                          r"samples \(1 workers\).*per_device_train_batch_size \(3\) x 2 workers = "
                                          r"6.*num_workers in \[1\]"):
        trainer.train(resume_from_checkpoint=True)
    with pytest.raises(ConfigError, match="is a full \\(DDP\\) checkpoint"):
        Trainer(model=make_blocks(), args=blocks_args(out, num_workers=0, strategy="fsdp"),
                train_dataset=TokenData(24)).train(resume_from_checkpoint=True)
