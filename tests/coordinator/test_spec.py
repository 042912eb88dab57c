"""The run's spec (raytrainer/coordinator/spec.py): what the coordinator reads of a run, built once from raytrainer's
TrainingArguments (the hosted mode's from its options: tests/hosting/test_options.py), the one `use_gpu` rule, and
the part of it a worker group is built from (group.py's GroupSpec). No Ray: the cluster's GPUs are stubbed."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from raytrainer import TrainingArguments
from raytrainer.coordinator import cluster
from raytrainer.coordinator.group import GroupSpec
from raytrainer.coordinator.spec import RunSpec, decide_use_gpu


def test_the_defaults_are_the_training_arguments_defaults(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path))
    built = RunSpec.of_arguments(args, use_gpu=False)
    assert built == RunSpec(num_workers=1, use_gpu=False)
    for field in dataclasses.fields(RunSpec):
        if hasattr(args, field.name) and field.name != "use_gpu":
            assert getattr(built, field.name) == getattr(args, field.name), field.name


def test_built_from_the_arguments_every_field_the_coordinator_reads(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), num_workers=(2, 4), resources_per_worker={"CPU": 2},
                             max_failures=3, max_preemptions=1, worker_idle_timeout_s=5,
                             elastic_resize_monitor_interval_s=7, ddp_timeout=60, ray_address="auto", run_name="r",
                             storage_options={"key": "k"}, log_level="debug", gradient_accumulation_steps=12)
    built = RunSpec.of_arguments(args, use_gpu=False)
    assert (built.min_workers, built.max_workers, built.elastic, built.in_process) == (2, 4, True, False)
    assert built.resources_per_worker == {"CPU": 2} and built.resources_per_worker is not args.resources_per_worker
    assert (built.max_failures, built.max_preemptions, built.worker_idle_timeout_s) == (3, 1, 5)
    assert (built.elastic_resize_monitor_interval_s, built.ddp_timeout, built.ray_address) == (7, 60, "auto")
    assert (built.run_name, built.storage_options, built.ray_train_log_level) == ("r", {"key": "k"}, "DEBUG")
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.max_failures = 0


def test_one_worker_reserves_a_cpu_and_a_gpu_with_gpus_unless_told():
    assert RunSpec(num_workers=2, use_gpu=False).per_worker() == {"CPU": 1}
    assert RunSpec(num_workers=2, use_gpu=True).per_worker() == {"CPU": 1, "GPU": 1}
    assert RunSpec(num_workers=2, use_gpu=True, resources_per_worker={"CPU": 4}).per_worker() == {"CPU": 4, "GPU": 1}


def test_the_use_gpu_rule_on_workers_and_in_this_process(monkeypatch):
    monkeypatch.setattr(cluster, "cluster_has_gpus", lambda: True)
    assert decide_use_gpu(None, 2) is True  # the cluster's GPUs
    assert decide_use_gpu(False, 2) is False
    monkeypatch.setattr(cluster, "cluster_has_gpus", lambda: False)
    assert decide_use_gpu(None, 2) is False
    assert decide_use_gpu(True, 2) is True  # as asked: Ray places the workers on GPUs, or says it cannot
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert decide_use_gpu(None, 0) is False  # raytrainer's Trainer in this process: CUDA only when asked
    assert decide_use_gpu(True, 0) is True
    assert decide_use_gpu(None, 0, in_process_default=True) is True  # a hosted script: CUDA where it is
    assert decide_use_gpu(False, 0, in_process_default=True) is False
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert decide_use_gpu(True, 0) is False  # no CUDA here: the CPU, whatever was asked


def test_a_group_is_built_from_the_part_ray_train_takes_at_its_start():
    fixed = GroupSpec.of(RunSpec(num_workers=2, use_gpu=False, elastic_resize_monitor_interval_s=9))
    assert (fixed.num_workers, fixed.elastic_resize_monitor_interval_s, fixed.resources_per_worker) == (2, None, ())
    elastic = GroupSpec.of(RunSpec(num_workers=(1, 3), use_gpu=False, resources_per_worker={"CPU": 2}))
    assert (elastic.num_workers, elastic.elastic_resize_monitor_interval_s) == ((1, 3), 60.0)
    assert elastic.resources_per_worker == (("CPU", 2),)
    # What a job may change without a new group: its failures, storage and name are not the group's.
    assert GroupSpec.of(RunSpec(num_workers=2, use_gpu=False, max_failures=5, run_name="x",
                                storage_options={"a": 1})) == fixed
