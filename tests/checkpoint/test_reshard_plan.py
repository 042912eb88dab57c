"""The accumulation that keeps a run's global batch at another world size (no Ray needed)."""

import pytest

from raytrainer import ConfigError, TrainingArguments


def keep(saved, world_size, **kw):
    from raytrainer.data.global_batch import accumulation_to_keep

    return accumulation_to_keep(saved, TrainingArguments(output_dir="unused", **kw), world_size)


def test_the_accumulation_follows_the_world_size():
    saved = {"global_batch_size": 32, "world_size": 4}
    assert keep(saved, 4, per_device_train_batch_size=8) is None  # same world size: nothing to change
    assert keep(saved, 2, per_device_train_batch_size=8) == 2
    assert keep(saved, 1, per_device_train_batch_size=8) == 4
    assert keep(saved, 8, per_device_train_batch_size=4) is None  # already 4 x 8 x 1 = 32
    assert keep({}, 2) is None and keep(None, 2) is None  # checkpoints that predate the field


def test_a_global_batch_that_cannot_be_kept_names_the_numbers_and_the_fixes():
    with pytest.raises(ConfigError) as info:
        keep({"global_batch_size": 24, "world_size": 3}, 5, per_device_train_batch_size=4)
    message = str(info.value)
    assert "resuming at 5 workers" in message and "global batch of 24 samples (3 workers)" in message
    assert "per_device_train_batch_size (4) x 5 workers = 20" in message
    assert "num_workers in [1, 2, 3, 6]" in message
    with pytest.raises(ConfigError, match=r"set per_device_train_batch_size to one of \[1, 2, 3, 6\]\.$"):
        keep({"global_batch_size": 24, "world_size": 3}, 4, per_device_train_batch_size=5)
