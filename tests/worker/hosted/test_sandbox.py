"""What a hosted job changes in a worker process that outlives it is put back (raytrainer/worker/hosted/
sandbox.py): the next job on a kept group starts as the first one did."""

from __future__ import annotations

import importlib
import os
import sys

import torch
import torch.distributed as dist

from raytrainer.worker.hosted.sandbox import sandbox


def test_environment_paths_directory_and_dtype_come_back(tmp_path):
    before = (dict(os.environ), list(sys.argv), list(sys.path), os.getcwd(), torch.get_default_dtype())
    with sandbox():
        os.environ["WANDB_DISABLED"] = "true"
        os.environ.pop("PATH")
        sys.argv[:] = ["script.py", "--lr", "1"]
        sys.path.insert(0, str(tmp_path))
        os.chdir(tmp_path)
        torch.set_default_dtype(torch.float64)
    assert (dict(os.environ), list(sys.argv), list(sys.path), os.getcwd(), torch.get_default_dtype()) == before


def test_accelerate_state_is_forgotten():
    from accelerate.state import GradientState, PartialState

    with sandbox():
        PartialState(cpu=True)
        GradientState(gradient_accumulation_plugin=None)
        assert PartialState._shared_state and GradientState._shared_state
    assert PartialState._shared_state == {} and GradientState._shared_state == {}


def test_patched_attributes_of_transformers_modules_are_put_back():
    """A kernel library swaps a model's classes and functions: in a module loaded before the job, and in one the
    job loads first."""
    loaded = importlib.import_module("transformers.models.gpt2.modeling_gpt2")
    original_mlp = loaded.GPT2MLP
    name = "transformers.models.opt.modeling_opt"
    first_import = name not in sys.modules
    with sandbox():
        loaded.GPT2MLP = torch.nn.Identity
        fresh = importlib.import_module(name)
        original_attention = fresh.OPTAttention
        fresh.OPTAttention = torch.nn.Identity
    assert loaded.GPT2MLP is original_mlp
    assert sys.modules[name].OPTAttention is original_attention, f"first imported in the job: {first_import}"


def test_the_process_group_outlives_the_job(tmp_path):
    """transformers 5's Trainer.end() and many torchrun scripts destroy the group; a script may init its own."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with sandbox():
            dist.init_process_group("gloo")  # already up: returns
            dist.destroy_process_group()
            assert dist.is_initialized()
        assert dist.destroy_process_group is not None and dist.is_initialized()
    finally:
        dist.destroy_process_group()
    assert not dist.is_initialized()
