"""A one-worker hosted job runs as one plain process would (RANK, LOCAL_RANK, WORLD_SIZE unset), except for
arguments that ask for HF's FSDP, which HF runs only distributed: those are built as under `torchrun
--nproc_per_node 1`. Here without Ray: `TrainingArguments.__post_init__` is replaced by one that records the
environment it sees (building real arguments with fsdp would start accelerate's process group)."""

import os

import pytest
import transformers

from raytrainer.worker.hosted import ONE_PROCESS_UNSET, one_process

TORCHRUN_ONE = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1", "NODE_RANK": "0"}


@pytest.fixture
def seen(monkeypatch):
    for name, value in TORCHRUN_ONE.items():
        monkeypatch.setenv(name, value)
    records = []

    def recording_post_init(self):
        records.append({name: os.environ.get(name) for name in ONE_PROCESS_UNSET})

    monkeypatch.setattr(transformers.TrainingArguments, "__post_init__", recording_post_init)
    return records


def test_one_worker_unsets_the_ranks_but_arguments_with_fsdp_see_them(seen, tmp_path):
    with one_process(1):
        assert not any(name in os.environ for name in ONE_PROCESS_UNSET)
        transformers.TrainingArguments(output_dir=str(tmp_path))
        assert not any(name in os.environ for name in ONE_PROCESS_UNSET)
        transformers.TrainingArguments(output_dir=str(tmp_path), fsdp="full_shard")
        assert {name: os.environ.get(name) for name in ONE_PROCESS_UNSET} == TORCHRUN_ONE  # for the Trainer too
    assert seen == [dict.fromkeys(ONE_PROCESS_UNSET), TORCHRUN_ONE]
    assert transformers.TrainingArguments.__post_init__.__name__ == "recording_post_init"  # put back


def test_a_subclass_with_its_own_post_init_is_seen_through_super(seen, tmp_path):
    """TRL's configs define __post_init__ and call the base's."""

    class Config(transformers.TrainingArguments):
        def __post_init__(self):
            super().__post_init__()

    with one_process(1):
        Config(output_dir=str(tmp_path), fsdp=["full_shard", "auto_wrap"])
    assert seen == [TORCHRUN_ONE]


def test_two_workers_change_nothing(seen, tmp_path):
    with one_process(2):
        transformers.TrainingArguments(output_dir=str(tmp_path))
    assert seen == [TORCHRUN_ONE]
