"""A `datasets.IterableDataset` of 1,000 generated rows (4 shards, shuffled with a seed) with max_steps, on 2
workers: every row once per pass and a second pass reshuffled by set_epoch; a worker killed mid-pass resumes to
the uninterrupted weights; and the numbers are transformers' Trainer's in one process on the same stream, with
the same global batch, across the pass boundary (accumulation 1: with more, transformers' loop does not step at
a stream's end, as its length is unknown). Evaluation and prediction on an iterable dataset too; and a resume
of the uninterrupted run's checkpoint on 1 worker trains the same rows to the same weights."""

import collections
import math
import os

import numpy as np
import pytest

from raytrainer.data.collator import DefaultCollator
from tests.integration.test_ray_data import KILL_AT, make_trainer, trained_rows
from tests.models import VOCAB, assert_same_weights, make_model, weights

datasets = pytest.importorskip("datasets")
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("ray_session")

ROWS = 1000
BATCH = 24  # per worker: 48 rows a step, 21 steps a pass (the last one of 40 rows), so 24 steps go into pass 2
MAX_STEPS = 24
LR = 1e-2


def columns(count: int) -> dict:
    idx = np.arange(count)
    ids = (idx[:, None] * 7 + np.arange(6)[None, :]) % VOCAB
    labels = np.where((idx[:, None] + np.arange(6)[None, :]) % 5 == 0, -100, (ids + 1) % VOCAB)  # items vary
    return {"idx": idx.tolist(), "input_ids": ids.tolist(), "labels": labels.tolist()}


def stream(count: int = ROWS, shuffled: bool = True):
    ds = datasets.Dataset.from_dict(columns(count)).to_iterable_dataset(num_shards=4)
    return ds.shuffle(seed=3, buffer_size=64) if shuffled else ds


def transformers_run(tmp_path, eval_rows) -> dict:
    """transformers' Trainer in this process: 48 rows a step, the same stream (it calls set_epoch too)."""
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), per_device_train_batch_size=2 * BATCH, per_device_eval_batch_size=64,
        max_steps=MAX_STEPS, learning_rate=LR, logging_steps=1, save_strategy="no", report_to="none",
        use_cpu=True, disable_tqdm=True, seed=5)
    trainer = transformers.Trainer(model=make_model(), args=args, train_dataset=stream(),
                                   data_collator=DefaultCollator())
    trainer.train()
    logs = [(h["loss"], h["epoch"]) for h in trainer.state.log_history if "loss" in h]
    predicted = trainer.predict(eval_rows)  # one batch of 50: its loss is the mean over every label item
    return {"logs": logs, "weights": weights(trainer.model), "test_loss": predicted.metrics["test_loss"],
            "label_ids": predicted.label_ids}


def test_every_row_once_per_pass_exact_after_a_kill_and_transformers_numbers(tmp_path):
    eval_rows = stream(50, shuffled=False)
    reference = make_trainer(tmp_path, "ref", stream(), per_device_train_batch_size=BATCH, max_steps=MAX_STEPS,
                             learning_rate=LR)
    out = reference.train()
    assert out.global_step == MAX_STEPS and reference.state.epoch_index == 1
    counts = trained_rows(reference)
    second_pass = stream()
    second_pass.set_epoch(1)
    first_144 = [row["idx"] for _, row in zip(range(3 * 2 * BATCH), second_pass)]
    assert counts[0] == collections.Counter(range(ROWS))  # every row once in the first pass
    assert counts[1] == collections.Counter(first_144)  # then the reshuffled pass's first 3 steps
    assert first_144 != list(range(3 * 2 * BATCH))

    # Evaluation and prediction of an iterable dataset on 2 workers: every batch once, back in stream order.
    evaluation = reference.evaluate(eval_rows)
    predicted = reference.predict(eval_rows)

    expected = transformers_run(tmp_path, eval_rows)
    logs = [(h["loss"], h["epoch"]) for h in reference.state.log_history if "loss" in h]
    assert len(logs) == len(expected["logs"]) == MAX_STEPS
    # The loss, and the epoch as transformers counts a stream's (micro-batches / (max_steps x accumulation)).
    bad = [(step, ours, theirs) for step, (ours, theirs) in enumerate(zip(logs, expected["logs"]), 1)
           if not (math.isclose(ours[0], theirs[0], rel_tol=1e-4) and math.isclose(ours[1], theirs[1], abs_tol=1e-4))]
    assert bad == []
    assert_same_weights(weights(reference.model), expected["weights"])
    assert math.isclose(evaluation["eval_loss"], expected["test_loss"], rel_tol=1e-4)
    assert math.isclose(predicted.metrics["test_loss"], expected["test_loss"], rel_tol=1e-4)
    np.testing.assert_array_equal(predicted.label_ids, expected["label_ids"])

    # Rank 1 dies during step KILL_AT (6) once checkpoint-4 is committed; the group restarts and resumes there.
    killed = make_trainer(tmp_path, "killed", stream(), die=True, per_device_train_batch_size=BATCH,
                          max_steps=MAX_STEPS, learning_rate=LR)
    killed.train()
    assert killed._group is reference._group
    assert os.path.exists(killed.marker), "the injected failure never happened"
    [restart] = killed.state.restarts
    assert restart["global_step"] == KILL_AT - 2
    assert trained_rows(killed, resumed_at=KILL_AT - 2) == counts
    assert_same_weights(weights(killed.model), weights(reference.model), atol=1e-6)

    # The uninterrupted run's checkpoint-12 resumed on 1 worker: the global batch is kept (2 micro-batches of
    # 24 a step) and the position is a global offset, so the same rows follow and the weights agree (to the
    # order of the sums).
    one = make_trainer(tmp_path, "one", stream(), num_workers=1, per_device_train_batch_size=BATCH,
                       max_steps=MAX_STEPS, learning_rate=LR)
    one.train(resume_from_checkpoint=os.path.join(reference.args.output_dir, "checkpoint-12"))
    assert rows_by_step(one) == {step: ids for step, ids in rows_by_step(reference).items() if step > 12}
    assert_same_weights(weights(one.model), weights(reference.model))


def rows_by_step(trainer) -> dict:
    """{step: sorted row ids} of every micro-batch trainer's run wrote (CountsRows' files)."""
    steps = collections.defaultdict(list)
    for name in os.listdir(trainer.log_dir):
        for line in open(os.path.join(trainer.log_dir, name)):
            _, step, _, *ids = (int(x) for x in line.split())
            steps[step] += ids
    return {step: sorted(ids) for step, ids in steps.items()}
