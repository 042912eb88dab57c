"""Ray Data input against a map-style dataset of the same rows, on 2 workers: training throughput
(samples/s, the ratio of the two) and the time each worker waits for its next batch per step.

    python benchmarks/ray_data.py              # 200 steps per variant, ~3 min on 2 cores
    python benchmarks/ray_data.py --quick      # 80 steps

Workload: the tiny GPT-2 of examples/ray_data_lm.py on CPython's help topics cut into 64-byte blocks.
  map_style  the blocks tokenised on the driver beforehand, a torch Dataset (the baseline)
  ray_data   the documents as a ray.data.Dataset; tokenisation in map_batches (an actor pool of one) while
             the workers train
Figures come from the workers' own per-rank statistics (`rank_stats` of each log, logging_steps=10): the
first log (start-up, the pipeline filling) is left out. Target: ray_data / map_style >= 0.95.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import common
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import raytrainer  # noqa: E402
from examples.ray_data_lm import ByteTokenizer, DataArguments, documents, pipeline  # noqa: E402


class Blocks(torch.utils.data.Dataset):
    def __init__(self, rows):
        self.rows = rows

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        ids = torch.from_numpy(self.rows[i])
        return {"input_ids": ids, "labels": ids.clone()}


class RankStats(raytrainer.TrainerCallback):
    observes_only = True

    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, rank_stats=None, **kwargs):
        if rank_stats:
            self.logs.append(rank_stats)


def build_model():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4,
                                      bos_token_id=0, eos_token_id=0))


def run(name: str, steps: int, workdir: str) -> dict:
    data = DataArguments()
    train_docs, _ = documents(data.eval_topics)
    if name == "map_style":
        blocks = ByteTokenizer(data.block_size)({"text": [d["text"] for d in train_docs]})["input_ids"]
        dataset = Blocks(list(blocks))
    else:
        dataset = pipeline(train_docs, data)
    stats = RankStats()
    args = raytrainer.TrainingArguments(
        output_dir=os.path.join(workdir, name), num_workers=2, max_steps=steps, per_device_train_batch_size=16,
        learning_rate=3e-3, logging_steps=10, save_strategy="no", disable_tqdm=True, seed=0)
    trainer = raytrainer.Trainer(model=build_model(), args=args, train_dataset=dataset, callbacks=[stats])
    trainer.pop_callback(raytrainer.PrinterCallback)
    t0 = time.time()
    trainer.train()
    steady = stats.logs[1:]
    return {"wall_s": time.time() - t0,
            "samples_per_s": statistics.median(sum(r["samples_per_second"] for r in log) for log in steady),
            "data_wait_ms": [1000 * statistics.mean(log[rank]["data_wait_s"] for log in steady) for rank in (0, 1)],
            "step_ms": 1000 * statistics.median(statistics.mean(r["step_time_s"] for r in log) for log in steady)}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--quick", action="store_true")
    opts = parser.parse_args(argv)
    steps = opts.steps or (80 if opts.quick else 200)
    common.ship_by_value()
    common.start_ray(num_cpus=4)  # 2 training workers plus CPUs for Ray Data's tasks
    with tempfile.TemporaryDirectory(prefix="rt-raydata-") as workdir:
        results = {name: run(name, steps, workdir) for name in ("map_style", "ray_data")}
    common.stop_ray()
    base = results["map_style"]["samples_per_s"]
    rows = [[name, f"{r['samples_per_s']:.0f}", f"{r['samples_per_s'] / base:.3f}", f"{r['step_ms']:.1f}",
             " / ".join(f"{w:.2f}" for w in r["data_wait_ms"]), f"{r['wall_s']:.0f}"] for name, r in results.items()]
    common.print_table(f"Ray Data vs map-style input, 2 workers, {steps} steps ({os.getloadavg()[0]:.1f} load)",
                       ["input", "samples/s", "ratio", "step ms", "data wait ms/step (rank 0 / 1)", "wall s"],
                       rows)


if __name__ == "__main__":
    main()
