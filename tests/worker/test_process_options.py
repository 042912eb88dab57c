"""A job's process-wide torch flags end with it (worker/process_options.py `torch_flags_kept`, around every job in
worker/entry.py `run_job`): a kept worker runs job after job, and a job with full_determinism or tf32 must not
leave the next one on the deterministic kernels it did not ask for."""

import os
import types

import pytest
import torch

from raytrainer.worker.process_options import DETERMINISM_ENV, setup_process, torch_flags_kept


def flags():
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    return (torch.are_deterministic_algorithms_enabled(), cudnn.deterministic, cudnn.benchmark, matmul.allow_tf32,
            torch.get_float32_matmul_precision(), {k: os.environ.get(k) for k in DETERMINISM_ENV})


def job_args(**kwargs):
    return types.SimpleNamespace(**{"full_determinism": False, "seed": 42, "tf32": None, **kwargs})


@pytest.fixture
def clean_env(monkeypatch):
    for name in DETERMINISM_ENV:
        monkeypatch.delenv(name, raising=False)


def test_full_determinism_ends_with_its_job(clean_env):
    before = flags()
    with torch_flags_kept():
        setup_process(job_args(full_determinism=True), torch.device("cpu"))
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    assert flags() == before
    assert not torch.are_deterministic_algorithms_enabled()


def test_the_flags_come_back_when_the_job_fails(clean_env):
    before = flags()
    with pytest.raises(RuntimeError, match="the job failed"):
        with torch_flags_kept():
            torch.use_deterministic_algorithms(True, warn_only=True)
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.benchmark = True
            raise RuntimeError("the job failed")
    assert flags() == before
    assert not torch.is_deterministic_algorithms_warn_only_enabled()


def test_a_job_without_them_keeps_what_the_process_had(clean_env, monkeypatch):
    """What the process had before any job (the user's, in the driver process when num_workers=0) stays."""
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    torch.set_float32_matmul_precision("high")
    try:
        with torch_flags_kept():
            setup_process(job_args(), torch.device("cpu"))
            torch.set_float32_matmul_precision("highest")
        assert torch.get_float32_matmul_precision() == "high"
        assert os.environ["CUDA_LAUNCH_BLOCKING"] == "1"
    finally:
        torch.set_float32_matmul_precision("highest")
