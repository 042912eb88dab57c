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
from common import make_step_stamps_callback, timed_script_parser  # noqa: E402


class Classifier(torch.nn.Module):
    """32 features -> 256 -> 4 classes; returns HF's {"loss", "logits"}."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.ReLU(), torch.nn.Linear(256, 4))

    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}


class Rows(torch.utils.data.Dataset):
    """4096 random rows, the same under every launcher (seeded)."""

    def __init__(self, n: int = 4096):
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 32, generator=generator)
        self.y = torch.randint(0, 4, (n,), generator=generator)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"x": self.x[i], "labels": self.y[i]}


def main():
    options = timed_script_parser().parse_args()
    torch.manual_seed(0)
    args = TrainingArguments(output_dir=options.output_dir, max_steps=options.max_steps,
                             per_device_train_batch_size=16, logging_steps=50, save_strategy="no", report_to="none",
                             disable_tqdm=True, learning_rate=1e-3, use_cpu=True, dataloader_num_workers=0)
    Trainer(model=Classifier(), args=args, train_dataset=Rows(),
            callbacks=[make_step_stamps_callback(options.stamps, STARTED)]).train()


if __name__ == "__main__":
    main()
