"""What the transformers fields added for issue 15 do, checked cheaply: in-process runs (num_workers=0) and the
pieces alone (sampler order, loader options, the batched metrics protocol on two threads)."""

import dataclasses
import math
import os
import threading
import types

import numpy as np
import pytest
import torch

from raytrainer import ConfigError, EarlyStoppingCallback, Trainer, TrainingArguments
from raytrainer.checkpoint.listing import read_trainer_state
from raytrainer.data.loader_options import loader_options
from raytrainer.data.sampler import DistributedBatchSampler, epoch_order, order_options
from raytrainer.strategy.ddp import ddp_options
from raytrainer.worker.batch_metrics import BatchMetrics
from raytrainer.worker.meter import Meter
from raytrainer.worker.process_options import empty_cache_if_due, setup_process
from tests.hf_models import tiny_model
from tests.models import TinyLM, TokenData, make_model


def run_args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), num_workers=0, per_device_train_batch_size=4, disable_tqdm=True,
                save_strategy="no", report_to="none")
    return TrainingArguments(**{**base, **kw})


# ---------------------------------------------------------------------------------------------- tokens seen
@pytest.mark.parametrize("mode", ["all", "non_padding"])
def test_num_input_tokens_seen_counts_every_step_and_is_logged(tmp_path, mode):
    data = TokenData(16)
    args = run_args(tmp_path, max_steps=4, logging_steps=2, include_num_input_tokens_seen=mode,
                    train_sampling_strategy="sequential")
    trainer = Trainer(model=make_model(), args=args, train_dataset=data)
    trainer.train()
    batches = [[data[i] for i in range(s, s + 4)] for s in range(0, 16, 4)]
    if mode == "all":  # the padded input_ids of each batch (padded to its longest row)
        expected = sum(len(b) * max(len(x["input_ids"]) for x in b) for b in batches)
    else:  # the attention mask's ones: the real tokens
        expected = sum(len(x["input_ids"]) for b in batches for x in b)
    assert trainer.state.num_input_tokens_seen == expected
    logged = [h["num_input_tokens_seen"] for h in trainer.state.log_history if "loss" in h]
    assert logged[-1] == expected and logged[0] < expected


def test_num_input_tokens_seen_is_off_by_default(tmp_path):
    trainer = Trainer(model=make_model(), args=run_args(tmp_path, max_steps=2, logging_steps=1),
                      train_dataset=TokenData(8))
    trainer.train()
    assert trainer.state.num_input_tokens_seen == 0
    assert all("num_input_tokens_seen" not in h for h in trainer.state.log_history)


# ---------------------------------------------------------------------------------------------- sampling order
def test_sequential_and_random_orders():
    assert epoch_order(10, seed=1, epoch=0, shuffle=False).tolist() == list(range(10))
    assert sorted(epoch_order(10, seed=1, epoch=0, shuffle=True).tolist()) == list(range(10))


def test_group_by_length_sorts_mega_batches_longest_first_whatever_the_world_size():
    lengths = [int(x) for x in np.random.default_rng(0).integers(1, 100, 400)]
    order = epoch_order(400, seed=3, epoch=0, shuffle=True, lengths=lengths, group_size=4)
    assert sorted(order.tolist()) == list(range(400))
    assert lengths[order[0]] == max(lengths)  # a batch too large for memory fails at the first step
    mega = min(400 // (4 * 4), 50) * 4  # transformers' mega-batch: up to 50 groups
    for start in range(0, 400, mega):
        chunk = [lengths[i] for i in order[start + 1:start + mega]]
        assert chunk == sorted(chunk, reverse=True)
    # The order is a function of the global batch only: 1 worker x 4 and 2 workers x 2 see the same batches.
    one = DistributedBatchSampler(400, 4, 0, 1, seed=3, lengths=lengths, group_size=4)
    halves = [DistributedBatchSampler(400, 2, r, 2, seed=3, lengths=lengths, group_size=4) for r in (0, 1)]
    assert [sorted(b) for b in one] == [sorted(a + b) for a, b in zip(*halves)]


def test_group_by_length_reads_the_length_column_or_the_main_input():
    datasets = pytest.importorskip("datasets")
    args = TrainingArguments(train_sampling_strategy="group_by_length", per_device_train_batch_size=2,
                             length_column_name="n")
    table = datasets.Dataset.from_dict({"input_ids": [[1], [1, 2, 3], [1, 2]], "n": [10, 30, 20]})
    assert order_options(args, table, "input_ids", 1)["lengths"] == [10, 30, 20]
    assert order_options(args, TokenData(3), "input_ids", 2)["lengths"] == [len(TokenData(3)[i]["input_ids"])
                                                                            for i in range(3)]
    assert order_options(args, TokenData(3), "input_ids", 2)["group_size"] == 4
    with pytest.raises(ValueError, match="length_column_name"):
        order_options(args, TokenData(3), "pixel_values", 1)


def test_group_by_length_trains(tmp_path):
    args = run_args(tmp_path, max_steps=3, group_by_length=True)
    assert Trainer(model=make_model(), args=args, train_dataset=TokenData(24)).train().global_step == 3


# ---------------------------------------------------------------------------------------------- data loading
def test_loader_options_follow_the_dataloader_fields():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    args = TrainingArguments()
    assert loader_options(args, cpu) == {"num_workers": 0, "pin_memory": False}
    assert loader_options(args, cuda)["pin_memory"] is True
    assert loader_options(TrainingArguments(dataloader_pin_memory=False), cuda)["pin_memory"] is False
    args = TrainingArguments(dataloader_num_workers=2, dataloader_persistent_workers=True,
                             dataloader_prefetch_factor=3, dataloader_multiprocessing_context="spawn")
    assert loader_options(args, cpu) == {"num_workers": 2, "pin_memory": False, "persistent_workers": True,
                                         "prefetch_factor": 3, "multiprocessing_context": "spawn"}


def test_dataloader_worker_processes_train(tmp_path):
    args = run_args(tmp_path, max_steps=2, dataloader_num_workers=1, dataloader_persistent_workers=True,
                    dataloader_prefetch_factor=2, dataloader_multiprocessing_context="fork")
    assert Trainer(model=make_model(), args=args, train_dataset=TokenData(8)).train().global_step == 2


# ---------------------------------------------------------------------------------------------- process options
FLAGS_SEEN = []  # module level: the job runs on a copy of the trainer, whose class is found here by name


class FlagsRecording(Trainer):
    def training_step(self, *args, **kwargs):
        FLAGS_SEEN.append((torch.are_deterministic_algorithms_enabled(), os.environ.get("CUBLAS_WORKSPACE_CONFIG")))
        return super().training_step(*args, **kwargs)


def test_full_determinism_and_tf32_are_set_in_the_training_process(tmp_path, monkeypatch):
    """While the job trains (the forward sees them), not after it: a kept worker's next job starts without them
    (worker/process_options.py torch_flags_kept)."""
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    FLAGS_SEEN.clear()
    try:
        FlagsRecording(model=make_model(), args=run_args(tmp_path, max_steps=1, full_determinism=True),
                       train_dataset=TokenData(4)).train()
        assert FLAGS_SEEN and set(FLAGS_SEEN) == {(True, ":16:8")}
        assert not torch.are_deterministic_algorithms_enabled() and "CUBLAS_WORKSPACE_CONFIG" not in os.environ
    finally:
        torch.use_deterministic_algorithms(False)
    setup_process(TrainingArguments(tf32=False), torch.device("cpu"))
    assert torch.backends.cuda.matmul.allow_tf32 is False
    with pytest.raises(RuntimeError, match="tf32=True.*GPU"):
        setup_process(types.SimpleNamespace(full_determinism=False, seed=0, tf32=True), torch.device("cpu"))


def test_torch_empty_cache_steps(monkeypatch):
    calls = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(1))
    args = TrainingArguments(torch_empty_cache_steps=2)
    for step in range(1, 7):
        empty_cache_if_due(args, step, torch.device("cuda", 0))
        empty_cache_if_due(args, step, torch.device("cpu"))  # nothing to empty
    assert len(calls) == 3
    empty_cache_if_due(TrainingArguments(), 4, torch.device("cuda", 0))
    assert len(calls) == 3


def test_use_cache_is_set_on_the_models_config():
    pytest.importorskip("transformers")
    from raytrainer.strategy.prepare import prepare

    model = tiny_model("gpt2", vocab_size=32, n_positions=8, n_embd=8, n_layer=1, n_head=2)
    assert model.config.use_cache is True
    prepare(model, TrainingArguments())
    assert model.config.use_cache is False  # transformers' default, as its Trainer sets it


def test_ddp_options_pass_the_fields_that_are_set():
    assert ddp_options(TrainingArguments()) == {}
    args = TrainingArguments(ddp_find_unused_parameters=True, ddp_bucket_cap_mb=10, ddp_broadcast_buffers=False,
                             ddp_static_graph=True)
    assert ddp_options(args) == {"find_unused_parameters": True, "bucket_cap_mb": 10, "broadcast_buffers": False,
                                 "static_graph": True}


# ---------------------------------------------------------------------------------------------- NaN/Inf filter
def test_nan_step_loss_is_logged_as_the_average_so_far():
    meter = Meter(torch.device("cpu"), nan_inf_filter=True)
    for loss in (2.0, 4.0, float("nan")):
        meter.add_micro(torch.tensor(loss), {}, 1.0)
        meter.step_done(None, 0.1, 0.0, 0.0)
    ctx = types.SimpleNamespace(world_size=1, rank=0, all_reduce_sum=lambda t: t)
    # transformers' formula: the sum since the last log over (1 + the steps since it): 6 / 3.
    assert meter.flush(ctx)["logs"]["loss"] == pytest.approx((2 + 4 + 6 / 3) / 3)
    unfiltered = Meter(torch.device("cpu"))
    unfiltered.add_micro(torch.tensor(float("nan")), {}, 1.0)
    unfiltered.step_done(None, 0.1, 0.0, 0.0)
    assert math.isnan(unfiltered.flush(ctx)["logs"]["loss"])


class NanOnFirstSample(TinyLM):
    def forward(self, input_ids, attention_mask=None, labels=None, idx=None):
        out = super().forward(input_ids, attention_mask, labels)
        if labels is not None and idx is not None and bool((idx == 0).any()):
            out["loss"] = out["loss"] * float("nan")
        return out


@pytest.mark.parametrize("nan_filter", [True, False])
def test_nan_eval_batches_are_left_out_of_eval_loss(tmp_path, nan_filter):
    torch.manual_seed(0)
    args = run_args(tmp_path, per_device_eval_batch_size=2, logging_nan_inf_filter=nan_filter)
    metrics = Trainer(model=NanOnFirstSample(), args=args, eval_dataset=TokenData(6)).evaluate()
    assert math.isfinite(metrics["eval_loss"]) is nan_filter


# ---------------------------------------------------------------------------------------------- batch_eval_metrics
class RunningAccuracy:
    """A batch_eval_metrics compute_metrics: accumulates, and summarises on compute_result=True."""

    def __init__(self):
        self.rows = self.calls = 0

    def __call__(self, prediction, compute_result):
        assert isinstance(prediction.predictions, torch.Tensor)
        self.rows += prediction.label_ids.shape[0]
        self.calls += 1
        if compute_result:
            out, self.rows, self.calls = {"rows": self.rows, "calls": self.calls}, 0, 0
            return out
        return None


def test_batch_eval_metrics_calls_compute_metrics_per_step(tmp_path):
    args = run_args(tmp_path, per_device_eval_batch_size=4, batch_eval_metrics=True)
    trainer = Trainer(model=make_model(), args=args, eval_dataset=TokenData(10), compute_metrics=RunningAccuracy())
    metrics = trainer.evaluate()
    assert (metrics["eval_rows"], metrics["eval_calls"]) == (10, 3) and "eval_loss" in metrics
    prediction = trainer.predict(TokenData(10))  # predict() still returns the predictions, as transformers
    assert prediction.predictions.shape[0] == 10 and prediction.metrics["test_rows"] == 10


def test_batch_eval_metrics_needs_compute_result(tmp_path):
    args = run_args(tmp_path, max_steps=1, batch_eval_metrics=True, eval_strategy="steps", eval_steps=1)
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(4), eval_dataset=TokenData(4),
                      compute_metrics=lambda p: {"x": 1})
    with pytest.raises(ConfigError, match="compute_result"):
        trainer.train()


class ThreadRanks:
    """all_gather_object between threads: the collective BatchMetrics relies on, without a process group."""

    def __init__(self, n):
        self.barrier, self.slots = threading.Barrier(n), [None] * n

    def ctx(self, rank):
        def all_gather_object(obj):
            self.slots[rank] = obj
            self.barrier.wait()
            out = list(self.slots)
            self.barrier.wait()
            return out
        return types.SimpleNamespace(is_main=rank == 0, all_gather_object=all_gather_object)


@pytest.mark.parametrize("counts", [(3, 2), (1, 0), (2, 2)])
def test_batch_metrics_pairs_ranks_with_different_batch_counts(counts):
    ranks, calls, results = ThreadRanks(2), [], {}

    def compute(prediction, compute_result):
        calls.append((prediction.label_ids.tolist(), compute_result))
        return {"n": len(calls)} if compute_result else None

    def rank(r):
        metrics = BatchMetrics(types.SimpleNamespace(compute_metrics=compute, ctx=ranks.ctx(r)))
        for b in range(counts[r]):
            metrics.add(torch.full((2, 3), float(b)), torch.tensor([10 * r + b, 10 * r + b]))
        results[r] = metrics.finish()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    steps = max(counts)
    assert [last for _, last in calls] == [False] * (steps - 1) + [True]
    expected = [[10 * r + b for r in range(2) if b < counts[r] for _ in range(2)] for b in range(steps)]
    assert [labels for labels, _ in calls] == expected
    assert results == {0: {"n": steps}, 1: {}}


# ---------------------------------------------------------------------------------------------- callback states
class WorseningMetric:
    def __init__(self):
        self.value = 0.0

    def __call__(self, prediction):
        self.value += 1.0
        return {"score": self.value}


def test_callback_states_are_saved_and_restored(tmp_path):
    args = run_args(tmp_path, max_steps=3, eval_strategy="steps", eval_steps=1, save_strategy="steps", save_steps=3,
                    metric_for_best_model="score", greater_is_better=False,
                    restore_callback_states_from_checkpoint=True)
    stopper = EarlyStoppingCallback(early_stopping_patience=5)
    Trainer(model=make_model(), args=args, train_dataset=TokenData(12), eval_dataset=TokenData(4),
            compute_metrics=WorseningMetric(), callbacks=[stopper]).train()
    stored = read_trainer_state(os.path.join(str(tmp_path), "checkpoint-3"))["stateful_callbacks"]
    assert stored["EarlyStoppingCallback"]["attributes"]["early_stopping_patience_counter"] == 2
    assert stored["EarlyStoppingCallback"]["args"]["early_stopping_patience"] == 5
    # Resumed with the flag (at the last step: no evaluation moves the counter), the callback passed to the
    # Trainer is replaced by one rebuilt from the checkpoint, and its train_begin keeps the restored counter.
    fresh = Trainer(model=make_model(), args=args, train_dataset=TokenData(12), eval_dataset=TokenData(4),
                    compute_metrics=WorseningMetric(), callbacks=[EarlyStoppingCallback(early_stopping_patience=1)])
    fresh.train(resume_from_checkpoint=True)
    restored = [c for c in fresh.callback_handler.callbacks if isinstance(c, EarlyStoppingCallback)]
    assert len(restored) == 1
    assert (restored[0].early_stopping_patience, restored[0].early_stopping_patience_counter) == (5, 2)
    # Without the flag, the Trainer's own callback stays.
    unflagged = dataclasses.replace(args, restore_callback_states_from_checkpoint=False)
    kept = EarlyStoppingCallback(early_stopping_patience=1)
    trainer = Trainer(model=make_model(), args=unflagged, train_dataset=TokenData(12), eval_dataset=TokenData(4),
                      compute_metrics=WorseningMetric(), callbacks=[kept])
    trainer.train(resume_from_checkpoint=True)
    assert [c for c in trainer.callback_handler.callbacks if isinstance(c, EarlyStoppingCallback)] == [kept]
