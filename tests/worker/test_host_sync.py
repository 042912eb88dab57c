"""No host sync in a training step: between two log steps, raytrainer's loop reads no device value on the host
beyond what the same model's forward/backward and optimizer read in a hand-written loop.

`tests/host_reads.py` counts the reads on CPU, with `cpu:0` standing for the GPU: the loop runs in this process
(num_workers=0) as rank 0 of a one-process gloo group, DDP or FSDP2, on a context whose device is `cpu:0`. Where
the loop branches on the device, it takes the GPU's branch: the step's exchange (worker/step_sync.py) goes
through `DeviceTransport` (pinned memory, non-blocking copies, an event), whose two CUDA calls are replaced by
CPU stand-ins below. Over 20 steps strictly between two log steps the reads of both loops are counted, and
raytrainer's may not exceed the hand loop's."""

import contextlib
import os

import pytest
import torch
import torch.distributed as dist

from raytrainer import Trainer, TrainerCallback, TrainingArguments
from raytrainer.data.collator import DefaultCollator
from raytrainer.worker import step_sync
from raytrainer.worker_context import WorkerContext
from tests.host_reads import DEVICE, HostReads, host
from tests.models import TokenData, make_model
from tests.support import free_port

STEPS = 20  # the counted steps 2..21, strictly between two log steps: the first step's (logging_first_step) and 22's
LAST = STEPS + 2  # logging_steps and max_steps
BATCH, ACCUMULATION = 2, 2
ROWS = LAST * BATCH * ACCUMULATION  # one epoch: no epoch's end among the counted steps


class HostEvent:
    """A CUDA event's stand-in: the copy it follows is done when `.to()` returns on CPU. Counts the host's
    waits on it (on a GPU: for the device to reach the exchange's copy, queued before the step's forward)."""

    waits = 0

    def __init__(self):
        self.recorded = False

    def record(self):
        self.recorded = True

    def synchronize(self):
        assert self.recorded, "the exchange's sums were read before their copy to the host was queued"
        HostEvent.waits += 1


class StandInTransport(step_sync.DeviceTransport):
    """The GPU's branch of the step's exchange, run on CPU: everything but pinning and the CUDA event."""

    def _pinned(self, tensor):
        return tensor  # host memory already; what matters is that the copy to the device does not block

    def _event(self):
        return HostEvent()


class DeviceContext(WorkerContext):
    """Rank 0 of a one-process gloo group that calls itself distributed (so DDP wraps the model and the step's
    exchange runs), on the device that stands for the GPU."""

    @property
    def distributed(self) -> bool:
        return True


@pytest.fixture
def gpu_branch(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", os.environ.get("GLOO_SOCKET_IFNAME", "lo"))  # for this test only
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    monkeypatch.setattr(WorkerContext, "in_process", classmethod(lambda cls, use_gpu: DeviceContext(device=DEVICE)))
    monkeypatch.setattr(step_sync, "transport_for", lambda device: StandInTransport(device))
    HostEvent.waits = 0
    yield
    dist.destroy_process_group()


class CountSteadySteps(TrainerCallback):
    """Counts from the first step's log to the end of the last step before the next log (step LAST - 1)."""

    on_every_rank = True  # inside the loop, in its thread
    observes_only = True  # no control all-reduce for it
    reads, steps, waits = None, 0, 0  # the last run's counter, counted steps and event waits (class attributes:
    # the loop runs a copy of this callback)

    def on_log(self, args, state, control, **kwargs):
        if state.global_step == 1 and CountSteadySteps.reads is None:
            CountSteadySteps.reads, CountSteadySteps.steps = HostReads().start(), 0
            HostEvent.waits = 0

    def on_step_end(self, args, state, control, **kwargs):
        if CountSteadySteps.reads is not None and 1 < state.global_step < LAST:
            CountSteadySteps.steps += 1
            if state.global_step == LAST - 1:
                CountSteadySteps.reads.stop()
                CountSteadySteps.waits = HostEvent.waits


def host_rows() -> TokenData:
    data = TokenData(ROWS)
    host(data.items)  # the dataset's rows live on the host, as a DataLoader's
    return data


class HostBatches(DefaultCollator):
    """Its batches are host memory, also those made before counting began (a loader may take them early)."""

    def __call__(self, features):
        return host(super().__call__(features))


def own_loop(tmp_path, strategy: str) -> HostReads:
    CountSteadySteps.reads = None
    args = TrainingArguments(output_dir=str(tmp_path), num_workers=0, per_device_train_batch_size=BATCH,
                             gradient_accumulation_steps=ACCUMULATION, max_steps=LAST, logging_steps=LAST,
                             logging_first_step=True,
                             learning_rate=1e-2, optim="adamw_torch", save_strategy="no", disable_tqdm=True,
                             strategy=strategy, average_tokens_across_devices=True,
                             include_num_input_tokens_seen="all")
    trainer = Trainer(model=make_model(), args=args, train_dataset=host_rows(), data_collator=HostBatches(),
                      callbacks=[CountSteadySteps()])
    try:
        trainer.train()  # in this thread: the callback's counter is stopped here if the loop raised
    finally:
        if CountSteadySteps.reads is not None:
            CountSteadySteps.reads.stop()
    assert CountSteadySteps.steps == STEPS
    return CountSteadySteps.reads


def hand_loop(strategy: str) -> HostReads:
    """The same model, data, optimizer (AdamW, linear schedule, clipping at 1.0) and accumulation, by hand."""
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    model = make_model().to(DEVICE)
    model = fully_shard(model) if strategy == "fsdp" else DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1 - step / LAST)
    batches = iter(torch.utils.data.DataLoader(host_rows(), batch_size=BATCH, collate_fn=HostBatches()))
    reads = HostReads()
    for step in range(1, LAST):
        if step == 2:
            reads.start()
        for micro in range(ACCUMULATION):  # gradients synchronised on the last micro-batch only, as the loop does
            last = micro == ACCUMULATION - 1
            if strategy == "fsdp":
                model.set_requires_gradient_sync(last)
            with model.no_sync() if strategy == "ddp" and not last else contextlib.nullcontext():
                batch = {k: v.to(DEVICE) for k, v in next(batches).items() if k != "idx"}
                (model(**batch)["loss"] / ACCUMULATION).backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if hasattr(norm, "full_tensor"):
            norm.full_tensor()
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
    reads.stop()
    return reads


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_the_loop_reads_no_device_value_per_step_beyond_a_hand_loop(tmp_path, gpu_branch, strategy):
    hand = hand_loop(strategy)
    own = own_loop(tmp_path, strategy)
    # The GPU's branch ran: the host waited on the exchange's event once a step, for its own copy (queued before
    # the step's forward), never on a device tensor.
    assert CountSteadySteps.waits == STEPS
    assert own.count <= hand.count, (f"{strategy}: raytrainer's loop read {own.count} device values in {STEPS} "
                                     f"steps, the hand loop {hand.count}. raytrainer's: {dict(own.sites())}; "
                                     f"the hand loop's: {dict(hand.sites())}")


def test_the_counter_counts_what_a_gpu_would_wait_for():
    """tests/host_reads.py: reads of device tensors, in autograd hooks too; not reads of host tensors, nor a
    non-blocking copy to the host."""
    weight = torch.ones(3, requires_grad=True)
    weight.register_hook(lambda grad: grad * grad.sum().item())  # read in the backward pass
    rows = host([torch.arange(3)])
    with HostReads() as reads:
        batch = torch.stack(rows)
        assert int((batch != 0).sum()) == 2  # the host's batch: no read
        x = batch.to(DEVICE).float()
        loss = (weight * x).sum()
        loss.backward()  # 1
        x.to(loss.device).tolist()  # 2: still on the device
        f"{loss}", loss.item(), loss.detach().cpu(), x[x > 0]  # 3, 4, 5, 6
        copy = loss.detach().to("cpu", non_blocking=True)
        copy.tolist()  # read after an event on a GPU: not counted here
    assert [what for what, _ in reads.reads] == ["item", "tolist", "__format__", "item", "cpu", "__getitem__"]
