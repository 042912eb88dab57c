"""One 2-worker Ray run (one worker-group start) for issue 19's figures: every training log record carries
consistent throughput keys summed over both ranks, on_log's rank_stats each rank's own, and
ProfilerCallback writes one loadable Chrome trace per rank. In process: tests/worker/test_throughput.py and
tests/callbacks/test_profiler.py."""

import json
import os

import pytest

from raytrainer import ProfilerCallback, Trainer, TrainerCallback, TrainingArguments
from tests.models import TokenData, make_model
from tests.worker.test_throughput import check_consistent


class RankStats(TrainerCallback):
    observes_only = True

    def __init__(self):
        self.seen = []

    def on_log(self, args, state, control, logs=None, rank_stats=None, **kwargs):
        if rank_stats:
            self.seen.append(rank_stats)


def test_throughput_keys_and_a_trace_per_rank_on_two_workers(tmp_path, ray_session):
    stats = RankStats()
    args = TrainingArguments(output_dir=str(tmp_path), num_workers=2, per_device_train_batch_size=4, max_steps=4,
                             logging_steps=2, save_strategy="no", disable_tqdm=True, peak_flops_per_device=1e9)
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(40),
                      callbacks=[stats, ProfilerCallback(start_step=2, end_step=3)])
    trainer.train()

    records = [h for h in trainer.state.log_history if "loss" in h]
    assert [r["step"] for r in records] == [2, 4]
    for record in records:
        check_consistent(record, world_size=2)
        # the peaks of both ranks (2 x 1e9) are the denominator
        assert record["train_mfu_percent"] / 100 * 2e9 == pytest.approx(record["train_tflops_per_device"] * 2e12,
                                                                        rel=1e-3)
        # 8 rows of 3..8 tokens per step over both ranks: the counts were summed
        assert 8 * 3 <= record["train_tokens_per_step"] <= 8 * 8
    assert len(stats.seen) == 2
    for rank_stats in stats.seen:
        assert [r["rank"] for r in rank_stats] == [0, 1]
        assert all(r["tokens_per_second"] > 0 and r["memory_mb"] > 0 for r in rank_stats)

    folder = tmp_path / "profile" / "steps_2-3"
    assert sorted(os.listdir(folder)) == ["rank0.summary.txt", "rank0.trace.json", "rank1.summary.txt",
                                          "rank1.trace.json"]
    for rank in (0, 1):
        trace = json.loads((folder / f"rank{rank}.trace.json").read_text())
        assert any("aten::" in e.get("name", "") for e in trace["traceEvents"])
