"""Iterable datasets (data/streaming.py), without Ray: each rank's share of every global micro-batch, every row
once per pass at any world size, a resume at a global sample offset (also at another world size, also in a
shuffled datasets stream's second pass), evaluation batches back in stream order, and the driver's checks."""

import itertools
import logging

import numpy as np
import pytest
import torch

from raytrainer import ConfigError, Trainer, TrainingArguments
from raytrainer.data.sampler import rank_share
from raytrainer.data.streaming import StreamEvalLoader, StreamTrainData, is_stream
from tests.models import TokenData, make_model

datasets = pytest.importorskip("datasets")


def ids(rows):
    return [row["idx"] for row in rows]


def stream(n: int, shuffled: bool = False):
    ds = datasets.Dataset.from_dict({"idx": list(range(n))}).to_iterable_dataset(num_shards=3)
    return ds.shuffle(seed=7, buffer_size=8) if shuffled else ds


def global_micro_batches(dataset, batch: int, world: int, epoch: int = 0, offset: int = 0, steps=None,
                         drop_last: bool = False):
    """The micro-batches of all ranks, micro-step by micro-step: [(rank 0's ids, filler), (rank 1's ...), ...],
    and each rank's reader at the end."""
    readers = [StreamTrainData(dataset, batch, ids, rank, world, drop_last) for rank in range(world)]
    per_rank = [itertools.islice(r.batches(epoch, offset), steps) for r in readers]
    return [list(step) for step in zip(*per_rank)], readers


def trained(steps) -> list:
    """Row ids trained on (fillers left out), in global order."""
    return [i for step in steps for rows, filler in step if not filler for i in rows]


def test_rank_share_is_the_samplers_rule():
    assert [rank_share(8, 4, r, 2) for r in range(2)] == [(0, 4), (4, 8)]  # a full micro-batch: contiguous slices
    assert [rank_share(5, 2, r, 3) for r in range(3)] == [(0, 2), (2, 4), (4, 5)]  # short: np.array_split's
    assert [rank_share(1, 2, r, 3) for r in range(3)] == [(0, 1), (1, 1), (1, 1)]  # ranks 1, 2 get nothing


@pytest.mark.parametrize("batch,world", [(6, 1), (3, 2), (2, 3)])
def test_every_row_once_a_pass_and_the_global_batch_does_not_depend_on_the_world_size(batch, world):
    steps, readers = global_micro_batches(stream(19), batch, world)
    assert trained(steps) == list(range(19))  # stream order, each row once
    assert [[i for rows, filler in step if not filler for i in rows] for step in steps] == [
        list(range(0, 6)), list(range(6, 12)), list(range(12, 18)), [18]]  # the same global micro-batches
    # The last micro-batch has 1 row: a rank without one trains on a zero-weight filler (that row again).
    assert steps[-1] == [([18], rank > 0) for rank in range(world)]
    assert all(r.ran_out and r.end == 19 and r.exhausted(19) for r in readers)
    assert readers[0].offset_after(0, 4) == 19 and readers[0].offset_after(0, 2) == 12


def test_drop_last_drops_the_short_micro_batch():
    steps, readers = global_micro_batches(stream(23), 3, 2, drop_last=True)
    assert trained(steps) == list(range(18)) and readers[0].end == 18


@pytest.mark.parametrize("world_after", [1, 2, 3])
def test_resume_at_a_global_offset_is_exact_at_any_world_size(world_after):
    """Stopped after 2 micro-steps of 2 x 3 rows in the shuffled stream's second pass, resumed with
    `world_after` workers and the same global micro-batch: the same rows follow, in the same order."""
    dataset = stream(23, shuffled=True)
    whole, _ = global_micro_batches(dataset, 3, 2, epoch=1)
    first, readers = global_micro_batches(dataset, 3, 2, epoch=1, steps=2)
    offset = readers[0].offset_after(0, 2)
    assert offset == 12
    rest, _ = global_micro_batches(dataset, 6 // world_after, world_after, epoch=1, offset=offset)
    assert trained(first) + trained(rest) == trained(whole)
    # set_epoch reshuffles each pass, as transformers asks datasets to: the second pass has its own order.
    first_pass, _ = global_micro_batches(dataset, 3, 2, epoch=0)
    assert sorted(trained(whole)) == list(range(23)) and trained(whole) != trained(first_pass)


def test_resume_at_the_end_of_a_pass_ends_it_and_a_skip_is_progress():
    steps, readers = global_micro_batches(stream(12), 3, 2, offset=12)
    assert steps == [] and readers[0].ran_out and readers[0].exhausted(12)
    marks = []  # the worker's watchdog: a long skip is not a hang
    reader = StreamTrainData(stream(23), 3, ids, 0, 2, progress=marks.append)
    assert next(reader.batches(0, 12)) == ([12, 13, 14], False)
    assert marks == ["skipping the stream's rows to the checkpoint's position (12 of 12)"]


class Counting(torch.utils.data.IterableDataset):
    """A torch IterableDataset with a length: its iteration is deterministic, so a resume skips rows exactly."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return ({"idx": i} for i in range(self.n))

    def __len__(self):
        return self.n


def test_a_sized_torch_stream_has_a_known_epoch():
    reader = StreamTrainData(Counting(10), 2, ids, 0, 2)
    assert is_stream(Counting(10)) and is_stream(stream(3))
    assert reader.micro_batches_per_epoch() == 3 and reader.fraction(4) == 1 / 3  # in micro-batches, as HF
    unknown = StreamTrainData(stream(10), 2, ids, 0, 2, epoch_micro_batches=8)  # max_steps x accumulation
    assert unknown.micro_batches_per_epoch() is None and unknown.fraction(6) == 2 / 8


@pytest.mark.parametrize("world", [1, 2, 4])
def test_evaluation_batches_interleave_back_to_stream_order(world):
    from raytrainer.data.ray_batches import interleave

    loaders = [StreamEvalLoader(stream(11), 2, ids, rank, world) for rank in range(world)]
    parts = [np.array(list(itertools.chain.from_iterable(loader))) for loader in loaders]  # as predictions are
    assert interleave(parts, [loader.sizes for loader in loaders], np.concatenate).tolist() == list(range(11))
    # 6 batches: on 4 ranks, ranks 2 and 3 take one fewer (a sharded model runs a filler pass for it).
    assert [loader.passes_behind() for loader in loaders] == [int(world == 4 and r >= 2) for r in range(world)]
    assert loaders[-1].filler_batch() == [0]


# ---------------------------------------------------------------------------------------------- the driver
def token_stream(n: int = 16):
    rows = TokenData(n).items
    return datasets.IterableDataset.from_generator(lambda: ({**r, "input_ids": r["input_ids"].tolist(),
                                                              "labels": r["labels"].tolist()} for r in rows))


def args(tmp_path, **kw):
    return TrainingArguments(**{**dict(output_dir=str(tmp_path / "out"), num_workers=0, disable_tqdm=True,
                                       per_device_train_batch_size=4, report_to="none"), **kw})


def test_refused_without_max_steps_or_when_already_split(tmp_path):
    trainer = Trainer(model=make_model(), args=args(tmp_path), train_dataset=token_stream())
    with pytest.raises(ConfigError, match="iterable dataset .* set max_steps"):
        trainer.train()
    from datasets.distributed import split_dataset_by_node

    trainer.train_dataset = split_dataset_by_node(token_stream(), rank=0, world_size=2)
    trainer.args = args(tmp_path, max_steps=2)
    with pytest.raises(ConfigError, match="split_dataset_by_node: pass the whole stream"):
        trainer.train()
    trainer.train_dataset = datasets.IterableDataset.from_generator(lambda: iter(()), features=datasets.Features(
        {"idx": datasets.Value("int64")}))
    with pytest.raises(ConfigError, match="train_dataset is empty"):
        trainer.train()


class OneShot(torch.utils.data.IterableDataset):
    """Gives its rows once: a second pass is empty."""

    def __init__(self, rows):
        self.rows = iter(rows)

    def __iter__(self):
        return self.rows


class TokenStream(torch.utils.data.IterableDataset):
    """A torch IterableDataset with a length: num_train_epochs works without max_steps, as in transformers."""

    def __init__(self, n):
        self.rows = TokenData(n).items

    def __iter__(self):
        return iter(self.rows)

    def __len__(self):
        return len(self.rows)


def test_in_process_passes_continue_and_a_one_shot_stream_stops(tmp_path, caplog):
    """num_workers=0: 16 rows, 4 a step, max_steps=6 goes into the second pass; a sized torch stream trains
    its epochs; a stream that gives its rows only once stops after its first pass with a warning instead of
    looping over empty passes."""
    trainer = Trainer(model=make_model(), args=args(tmp_path, max_steps=6, save_strategy="no"),
                      train_dataset=token_stream())
    out = trainer.train()
    assert out.global_step == 6 and trainer.state.epoch_index == 1
    trainer.train_dataset = TokenStream(10)
    trainer.args = args(tmp_path, num_train_epochs=2, save_strategy="no")
    out = trainer.train()
    assert out.global_step == 6 and trainer.state.epoch_index == 2 and trainer.state.epoch == 2.0  # 3 a pass
    trainer.train_dataset = OneShot(TokenData(9).items)
    trainer.args = args(tmp_path, max_steps=6, save_strategy="no", per_device_train_batch_size=2)
    with caplog.at_level(logging.WARNING, logger="raytrainer"):
        out = trainer.train()
    assert out.global_step == 4  # the loss check on the driver took 2 of its 9 rows: 7 left, 4 micro-steps
    assert "gave no row in epoch 1" in caplog.text
