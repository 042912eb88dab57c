import pytest

from raytrainer.data.sampler import DistributedBatchSampler, eval_shard


def batches(n, bs, world, offset=0, epoch=0, drop_last=False):
    out = []
    for rank in range(world):
        s = DistributedBatchSampler(n, bs, rank, world, seed=3, drop_last=drop_last)
        s.set_epoch(epoch, offset)
        out.append((list(s), [s.is_padding(i) for i in range(len(s))]))
    return out


@pytest.mark.parametrize("n", [16, 17, 41])
def test_global_batches_do_not_depend_on_world_size(n):
    one = batches(n, 8, 1)[0][0]
    two = batches(n, 4, 2)
    for step, big in enumerate(one):
        parts = []
        for sample_lists, pads in two:
            if not pads[step]:
                parts += sample_lists[step]
        assert sorted(parts) == sorted(big)


def test_every_sample_once_per_epoch_and_padding_only_on_short_last_batch():
    two = batches(41, 4, 2)
    seen = [i for lists, pads in two for b, p in zip(lists, pads) if not p for i in b]
    assert sorted(seen) == list(range(41))
    assert two[1][1] == [False] * 5 + [True]  # 41 = 5*8 + 1: rank 1 has only a filler in the last step
    assert two[0][1] == [False] * 6


def test_resume_offset_continues_at_the_same_sample_on_another_world_size():
    full = [i for b in batches(40, 8, 1)[0][0] for i in b]
    resumed = batches(40, 4, 2, offset=16)
    rest = [i for step in range(len(resumed[0][0])) for rank in range(2) for i in resumed[rank][0][step]]
    assert rest == full[16:]


def test_drop_last_and_epochs_reshuffle():
    s = DistributedBatchSampler(41, 4, 0, 2, seed=1, drop_last=True)
    assert len(s) == 5
    first = list(s)
    s.set_epoch(1)
    assert list(s) != first


@pytest.mark.parametrize("n,world", [(11, 2), (3, 4), (10, 3)])
def test_eval_shards_cover_dataset_in_order(n, world):
    assert [i for r in range(world) for i in eval_shard(n, r, world)] == list(range(n))
