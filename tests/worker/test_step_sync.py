"""The step's one collective (worker/step_sync.py): what its slots carry, and that a training step with stop
flags, label counting and token counting on runs exactly one collective. No Ray: a fake context, and the
in-process loop on a one-process gloo group whose context counts its collectives."""

import os

import pytest
import torch
import torch.distributed as dist

from raytrainer import Trainer, TrainerCallback, TrainingArguments
from raytrainer.worker import stopping
from raytrainer.worker.step_sync import StepSync
from raytrainer.worker_context import WorkerContext
from tests.models import TokenData, make_model
from tests.support import free_port


class FakeCtx:
    """Rank `rank` of `world_size`: the all-reduce adds what the other ranks would send (`others`)."""

    def __init__(self, rank=0, world_size=2, others=()):
        self.rank, self.world_size, self.others = rank, world_size, list(others)
        self.device, self.distributed, self.is_main = torch.device("cpu"), True, rank == 0
        self.calls = 0

    def all_reduce_sum(self, tensor):
        self.calls += 1
        for other in self.others:
            tensor += torch.tensor(other, dtype=tensor.dtype)
        return tensor

    def start_all_reduce_sum(self, tensor):
        """The sum lands when the handle is waited for, as a collective in flight."""
        others, self.waits = list(self.others), getattr(self, "waits", 0)

        class Work:
            def wait(work):
                self.waits += 1
                self.others, kept = others, self.others
                self.all_reduce_sum(tensor)
                self.others = kept

        return Work()


class FakeEmitter:
    def stop_watch(self):
        return None


def test_slots_are_summed_in_one_all_reduce_and_reset():
    ctx = FakeCtx(others=[[5, 7, 0]])
    sync = StepSync(ctx)
    a, b = sync.slot(), sync.slot(2)
    a.put(1)
    b.put(2, 3)
    sync.exchange()
    assert (a.total, b.totals, ctx.calls, sync.exchanges) == (6, [9, 3], 1, 1)
    ctx.others = []
    sync.exchange()  # nothing staged: zeros
    assert (a.total, b.totals, ctx.calls) == (0, [0, 0], 2)


def test_a_started_exchange_completes_at_the_first_read_or_use_of_a_late_total():
    """start() sends; nothing waits until a slot is read or the late total (num_items_in_batch) is used, and
    then once. The late total is floored, behaves as the tensor transformers passes, and returns plain tensors."""
    ctx = FakeCtx(others=[[0, 5]])
    sync = StepSync(ctx)
    flags, items = sync.slot(), sync.slot()
    items.put(0)
    sync.start()
    late = sync.late(items, floor=1)
    assert ctx.waits == 0
    loss = torch.tensor(10.0) / late  # the loss's first use: waits for the collective
    assert ctx.waits == 1 and isinstance(loss, torch.Tensor) and type(loss) is torch.Tensor
    assert float(loss) == 2.0 and int(late) == 5 and late.item() == 5 and f"{late}" == "5" and ctx.waits == 1
    assert (flags.total, items.total) == (0, 5) and ctx.waits == 1

    ctx.others = [[3, 0]]
    sync.start()  # nothing staged here, nothing elsewhere for the items: floored to 1
    late = sync.late(items, floor=1)
    assert flags.total == 3 and ctx.waits == 2  # reading a slot completes the exchange
    assert int(late) == 1 and ctx.waits == 2


class CountingContext(WorkerContext):
    """One process that calls itself distributed: DDP on a one-process gloo group, every collective counted."""

    log: list = []

    @property
    def distributed(self) -> bool:
        return True

    def all_reduce_sum(self, tensor):
        self.log.append("all_reduce_sum")
        return super().all_reduce_sum(tensor)

    def start_all_reduce_sum(self, tensor):
        self.log.append("all_reduce_sum")
        return super().start_all_reduce_sum(tensor)

    def all_reduce_max(self, tensor):
        self.log.append("all_reduce_max")
        return super().all_reduce_max(tensor)

    def all_gather_object(self, obj):
        self.log.append("all_gather_object")
        return super().all_gather_object(obj)

    def broadcast_object(self, obj, src=0):
        self.log.append("broadcast_object")
        return super().broadcast_object(obj, src)

    def barrier(self):
        self.log.append("barrier")
        super().barrier()


class StepMarks(TrainerCallback):
    observes_only = True  # no control point: the driver's decisions would add an all-reduce of their own

    def on_step_begin(self, args, state, control, **kwargs):
        CountingContext.log.append(("step", state.global_step))


@pytest.fixture
def one_process_group(monkeypatch):
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    monkeypatch.setattr(WorkerContext, "in_process", classmethod(lambda cls, use_gpu: CountingContext()))
    CountingContext.log = []
    yield CountingContext.log
    dist.destroy_process_group()


def test_one_collective_per_optimizer_step_with_stop_flags_labels_and_tokens(tmp_path, one_process_group):
    log = one_process_group
    args = TrainingArguments(output_dir=str(tmp_path), num_workers=0, per_device_train_batch_size=4,
                             gradient_accumulation_steps=2, max_steps=6, learning_rate=1e-2, optim="adamw_torch",
                             logging_strategy="no", save_strategy="no", disable_tqdm=True,
                             include_num_input_tokens_seen="all", average_tokens_across_devices=True)
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(48), callbacks=[StepMarks()])
    trainer.train()
    assert trainer.state.num_input_tokens_seen > 0
    marks = [i for i, entry in enumerate(log) if isinstance(entry, tuple)]
    assert [log[i][1] for i in marks] == [0, 1, 2, 3, 4, 5]
    # Between two steps' on_step_begin: the next step's exchange, nothing else.
    between = [log[a + 1:b] for a, b in zip(marks, marks[1:])]
    assert between == [["all_reduce_sum"]] * 5
    assert log[marks[0] - 1] == "all_reduce_sum"  # the first step's exchange, right before it


class StopAfter(TrainerCallback):
    """Raises the driver's stop request (as Ctrl-C would) during step `step`, on every rank."""

    observes_only = True
    raised = None

    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            StopAfter.raised = True


def test_a_stop_raised_during_step_s_is_agreed_in_the_next_exchange_and_saved_after_step_s_plus_1(
        tmp_path, one_process_group, monkeypatch):
    """The exchange runs beside the step it starts: a request raised during step 2 travels in step 3's exchange,
    read before step 4 takes its micro-batches, so the run saves checkpoint-3 and ends there (train() raises
    KeyboardInterrupt, as after Ctrl-C). On a real one-process gloo group: the exchange is started, not waited."""
    from raytrainer.callbacks import channel
    from raytrainer.checkpoint import listing

    StopAfter.raised = None
    watch = type("Watch", (), {"requested": lambda self: "interrupt" if StopAfter.raised else None})()
    monkeypatch.setattr(channel.Emitter, "stop_watch", lambda self: watch)
    monkeypatch.setattr(stopping, "POLL_S", 0.0)
    args = TrainingArguments(output_dir=str(tmp_path), num_workers=0, per_device_train_batch_size=4, max_steps=8,
                             learning_rate=1e-2, optim="adamw_torch", logging_strategy="no", save_strategy="no",
                             disable_tqdm=True, average_tokens_across_devices=True)
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(48), callbacks=[StopAfter(2)])
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    assert trainer.state.global_step == 3
    assert [c.step for c in listing.list_checkpoints(str(tmp_path))] == [3]


def test_a_torch_compiled_model_gets_the_count_settled_before_its_forward(tmp_path):
    """The late count must not enter code that dynamo traces: a compiled model's forward gets a plain tensor (a
    plain model keeps the late one, waited for where its loss uses it)."""
    seen = []

    class Net(torch.nn.Module):
        accepts_loss_kwargs = True  # transformers' switch, which a compiled module passes on

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(()))

        def forward(self, x, labels=None, num_items_in_batch=None):
            seen.append(type(num_items_in_batch))
            return {"loss": (self.w * x).sum() / num_items_in_batch}

    ctx = FakeCtx(others=[[0, 3]])
    for model in (Net(), torch.compile(Net(), backend="eager")):
        sync = StepSync(ctx)
        _, items = sync.slot(), sync.slot()
        items.put(1)
        sync.start()
        trainer = Trainer(model=model, args=TrainingArguments(output_dir=str(tmp_path), num_workers=0))
        loss = trainer.compute_loss(model, {"x": torch.ones(2)}, num_items_in_batch=sync.late(items, floor=1))
        assert float(loss) == 0.5
    assert [t.__name__ for t in seen] == ["LateTotal", "Tensor"]
