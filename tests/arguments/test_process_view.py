"""The properties transformers' example scripts read (process_view.py), answered for the driver."""

import logging

import pytest

from raytrainer import TrainingArguments

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("workers, world_size, mode", [(0, 1, "not_parallel"), (1, 1, "not_parallel"),
                                                        (2, 2, "distributed"), ((1, 4), 4, "distributed")])
def test_process_properties_answer_for_the_driver(workers, world_size, mode):
    args = TrainingArguments(num_workers=workers, gradient_accumulation_steps=12, use_gpu=False)
    assert (args.process_index, args.local_process_index, args.world_size) == (0, 0, world_size)
    assert args.should_log and args.should_save
    assert args.parallel_mode.value == mode
    assert args.parallel_mode is getattr(transformers.training_args.ParallelMode, mode.upper())
    assert str(args.device) == "cpu" and args.n_gpu == 0
    with args.main_process_first(desc="dataset map"):  # a no-op context manager on the driver
        pass
    assert args.local_rank == -1 and args.train_batch_size == args.per_device_train_batch_size


def test_device_describes_the_workers():
    gpu = TrainingArguments(num_workers=2, use_gpu=True)
    assert gpu.device.type == "cuda" and gpu.n_gpu == 1  # no GPU is needed on the driver to say so
    assert TrainingArguments(num_workers=2, use_cpu=True).device.type == "cpu"


def test_process_log_level_follows_transformers():
    assert TrainingArguments(log_level="info").get_process_log_level() == logging.INFO
    assert TrainingArguments().get_process_log_level() == transformers.utils.logging.get_verbosity()  # passive

