"""A plain `transformers.Trainer` script with a model so small that its step (~5 ms on 2 CPU processes) is mostly
HF's loop and what a launcher adds to each step: `python benchmarks/hosted.py --script plain` times it under
torchrun and under `raytrainer launch`, where a fixed per-step cost shows 8x larger than on hosted_sft.py's
step. It knows nothing of raytrainer. `--stamps FILE`: rank 0 writes the wall-clock times of the script's start,
of train begin and of every step end."""

from __future__ import annotations

import time

STARTED = time.time()  # before the imports: under either launcher, what the script itself costs

import os  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
from transformers import Trainer, TrainingArguments  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import MLP, SyntheticDataset, make_step_stamps_callback, timed_script_parser  # noqa: E402


def main():
    options = timed_script_parser().parse_args()
    torch.manual_seed(0)
    args = TrainingArguments(output_dir=options.output_dir, max_steps=options.max_steps,
                             per_device_train_batch_size=16, logging_steps=50, save_strategy="no", report_to="none",
                             disable_tqdm=True, learning_rate=1e-3, use_cpu=True, dataloader_num_workers=0)
    # 32 features -> 256 -> 4 classes, 4096 rows: the same under every launcher (seeded)
    Trainer(model=MLP(dim=32, hidden=256, depth=1, num_classes=4), args=args,
            train_dataset=SyntheticDataset(4096, 32, 4, seed=0),
            callbacks=[make_step_stamps_callback(options.stamps, STARTED)]).train()


if __name__ == "__main__":
    main()
