"""Where the loop's micro-batches come from (raytrainer/worker/train_data.py): a map-style dataset through the
distributed sampler (a global sample offset) and a user's own dataloader (a count of this rank's micro-batches).
Resumed at an offset, an epoch yields the rest of the uninterrupted epoch's batches and leaves torch's random
stream where the uninterrupted run has it (principle 3); the position reads as HF's fractional epoch."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader

from raytrainer.data.sampler import DistributedBatchSampler
from raytrainer.worker.train_data import LoaderData, SamplerData, train_data

ROWS = [{"x": torch.tensor([float(i)])} for i in range(10)]


def sampled(rank: int = 0, world_size: int = 1) -> DataLoader:
    sampler = DistributedBatchSampler(len(ROWS), 2, rank, world_size, seed=5, shuffle=True)
    return DataLoader(ROWS, batch_sampler=sampler)


def rows_of(batches) -> list:
    return [(batch["x"].flatten().tolist(), filler) for batch, filler in batches]


def test_the_kind_of_dataloader_picks_the_position():
    assert isinstance(train_data(sampled()), SamplerData)
    assert isinstance(train_data(DataLoader(ROWS, batch_size=2)), LoaderData)


def fresh_draw(seed: int) -> torch.Tensor:
    torch.manual_seed(seed)
    return torch.rand(1)


def test_a_sampled_epoch_resumed_at_a_global_offset_yields_the_rest_and_draws_no_random_number():
    """An epoch's start draws the dataloader's base seed from torch's stream, as transformers' loop does; a resume
    in the middle of the epoch does not draw it again (the checkpoint's streams were saved after that draw)."""
    torch.manual_seed(0)
    data = train_data(sampled())
    whole = rows_of(data.batches(epoch=1, offset=0))
    assert not torch.equal(torch.rand(1), fresh_draw(0))  # the epoch's start drew
    assert data.micro_batches_per_epoch() == 5 and len(whole) == 5
    offset = data.offset_after(0, 2)  # two micro-batches of 2 done: 4 samples into the epoch
    assert offset == 4 and data.fraction(offset) == 2 / 5 and not data.exhausted(offset)
    torch.manual_seed(0)
    resumed = train_data(sampled())
    assert rows_of(resumed.batches(epoch=1, offset=offset)) == whole[2:]
    assert torch.equal(torch.rand(1), fresh_draw(0))  # the resume drew nothing
    assert resumed.exhausted(10)


def test_a_sampled_epoch_at_another_world_size_continues_at_the_same_sample():
    """Two ranks resumed at the offset one rank reached: between them, the samples one rank had left."""
    one = train_data(sampled())
    seen = rows_of(one.batches(epoch=0, offset=0))
    rest = sorted(x for batch, _ in seen[2:] for x in batch)
    halves = [train_data(sampled(rank, 2)) for rank in (0, 1)]
    resumed = sorted(x for half in halves for batch, filler in rows_of(half.batches(0, 4)) if not filler
                     for x in batch)
    assert resumed == rest


def test_a_users_dataloader_is_resumed_by_skipping_batches_without_drawing_random_numbers():
    generator = torch.Generator().manual_seed(1)

    def loader():
        return DataLoader(ROWS, batch_size=3, shuffle=True, generator=generator)

    generator.manual_seed(1)
    data = train_data(loader())
    whole = rows_of(data.batches(epoch=0, offset=0))
    assert data.micro_batches_per_epoch() == 4 and all(not filler for _, filler in whole)
    generator.manual_seed(1)
    torch.manual_seed(7)
    resumed = train_data(loader())
    assert rows_of(resumed.batches(epoch=0, offset=3)) == whole[3:]
    assert torch.equal(torch.rand(1), fresh_draw(7))  # skipping and the mid-epoch iterator drew nothing
    assert resumed.offset_after(3, 1) == 4 and resumed.fraction(2) == 0.5 and resumed.exhausted(4)
