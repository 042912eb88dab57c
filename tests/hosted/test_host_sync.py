"""The hosted mode adds no host sync to HF's own loop: over 20 steps strictly between two log steps, a
`transformers.Trainer` run hosted reads no more device values on the host than the same Trainer run plainly.

`tests/host_reads.py` counts the reads on CPU. The hosted run is the Python API's in-process run (num_workers=0):
the same `Host` and `Relay` (worker/hosted/) wrap HF's loop as on each Ray worker, with the driver's callbacks
behind a direct sink. Its worker context takes the GPU's branch, as tests/worker/test_host_sync.py's does: its
device is cpu:0 (what the relay makes on the worker's device counts as device memory) and it calls itself
distributed (rank 0 of a one-process gloo group), so the relay combines control flags over ranks where a
multi-worker run would. The driver's callbacks are `raytrainer launch`'s (progress and a reporter), which steer
nothing: no rank waits for the driver between the log steps. (A driver callback that steers at every step costs
one small all-reduce of the flags a step, read on the host: that is same-step control, by design.)
"""

from __future__ import annotations

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

import raytrainer
from tests.host_reads import HostReads
from tests.hosted.test_api_on_ray import tiny_llama
from tests.worker.test_host_sync import gpu_branch  # noqa: F401  (fixture)

STEPS = 20  # counted: steps 2..21, strictly between the first step's log and step 22's
LAST = STEPS + 2  # logging_steps and max_steps


class Rows(torch.utils.data.Dataset):
    """Token rows as lists: the collator makes the batch's tensors on the host, also from a pickled copy of this
    dataset (the hosted run trains on one)."""

    def __init__(self, n: int = 2 * LAST):
        g = torch.Generator().manual_seed(0)
        self.rows = [torch.randint(3, 64, (12,), generator=g).tolist() for _ in range(n)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i]}


class CountSteadySteps(TrainerCallback):
    """HF's callback, in HF's loop: counts from the first step's log to the end of step LAST - 1. The hosted run
    calls a copy of it: what it counts is kept on the class."""

    on_every_rank = True  # hosted: a callback of HF's trainer on the ranks, not a driver callback (which would
    # steer every step: same-step control, an all-reduce of the flags a step)
    reads, steps = None, 0

    def on_log(self, args, state, control, **kwargs):
        if state.global_step == 1 and CountSteadySteps.reads is None:
            CountSteadySteps.reads, CountSteadySteps.steps = HostReads().start(), 0

    def on_step_end(self, args, state, control, **kwargs):
        if CountSteadySteps.reads is not None and 1 < state.global_step < LAST:
            CountSteadySteps.steps += 1
            if state.global_step == LAST - 1:
                CountSteadySteps.reads.stop()


def count(tmp_path, hosted: bool) -> HostReads:
    CountSteadySteps.reads = None
    args = TrainingArguments(output_dir=str(tmp_path / ("hosted" if hosted else "plain")), max_steps=LAST,
                             logging_steps=LAST, logging_first_step=True, per_device_train_batch_size=2,
                             learning_rate=1e-3, save_strategy="no", report_to="none", use_cpu=True,
                             disable_tqdm=True)
    build = raytrainer.hosted(Trainer, num_workers=0, disable_tqdm=True, report_to="tensorboard",
                              logging_dir=str(tmp_path / "tb")) if hosted else Trainer
    trainer = build(model=tiny_llama(), args=args, train_dataset=Rows(), callbacks=[CountSteadySteps()])
    try:
        trainer.train()
    finally:
        if CountSteadySteps.reads is not None:
            CountSteadySteps.reads.stop()  # in this thread, also when the loop raised
    assert CountSteadySteps.steps == STEPS
    return CountSteadySteps.reads


def test_hosting_adds_no_device_read_to_hfs_steps(tmp_path, gpu_branch):  # noqa: F811  (fixture)
    plain = count(tmp_path, hosted=False)
    hosted = count(tmp_path, hosted=True)
    assert hosted.count <= plain.count, (f"hosted, HF's loop read {hosted.count} device values in {STEPS} steps, "
                                         f"plainly {plain.count}. Hosted: {dict(hosted.sites())}; "
                                         f"plain: {dict(plain.sites())}")
