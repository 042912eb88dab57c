"""A plain transformers script with dropout on, a constant learning rate and no periodic checkpoint before its
last step, for the stop tests (test_stops_on_ray.py): one rank sends itself SIGTERM after a step (what a spot
node's notice does; `--sigterm_before_train`: before train(), then 2 s of the script's own work), or rank 0
pauses after a step, the test's moment to Ctrl-C the driver.

    python stops_script.py --output_dir DIR --results RES [--max_steps 10]
                           [--sigterm_rank 1 --sigterm_at 4 | --sigterm_before_train]
                           [--pause_at 4 --pause_s 3] [--marker FILE]

Each fault happens once (the marker file remembers; rank 0 writes it at a pause, for the test to see). Rank 0
writes RES/log_history.json and RES/weights.safetensors at the end."""

from __future__ import annotations

import argparse
import os
import signal
import time

import torch
from plain_script import (  # this folder is first on sys.path, as for `python stops_script.py`
    Rows,
    tiny_llama,
    write_results,
)
from transformers import Trainer, TrainerCallback, TrainingArguments


class Faults(TrainerCallback):
    def __init__(self, options):
        self.options = options

    def on_step_end(self, args, state, control, **kwargs):
        o, rank = self.options, int(os.environ.get("RANK", 0))
        if os.path.exists(o.marker):
            return
        if o.sigterm_at == state.global_step and rank == o.sigterm_rank:
            open(o.marker, "w").close()
            os.kill(os.getpid(), signal.SIGTERM)
        if o.pause_at == state.global_step and rank == 0:
            open(o.marker, "w").close()
            time.sleep(o.pause_s)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--results", required=True)
    parser.add_argument("--max_steps", type=int, default=10)
    parser.add_argument("--sigterm_rank", type=int, default=1)
    parser.add_argument("--sigterm_at", type=int, default=-1)
    parser.add_argument("--sigterm_before_train", action="store_true")
    parser.add_argument("--pause_at", type=int, default=-1)
    parser.add_argument("--pause_s", type=float, default=0)
    parser.add_argument("--marker", default="")
    options = parser.parse_args()
    model = tiny_llama(attention_dropout=0.2)
    args = TrainingArguments(output_dir=options.output_dir, max_steps=options.max_steps, save_steps=1000,
                             per_device_train_batch_size=2, logging_steps=1, learning_rate=1e-3, seed=42,
                             lr_scheduler_type="constant", report_to="none", disable_tqdm=True,
                             use_cpu=not torch.cuda.is_available(), dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=Rows(), callbacks=[Faults(options)])
    if options.sigterm_before_train and int(os.environ.get("RANK", 0)) == options.sigterm_rank \
            and not os.path.exists(options.marker):
        open(options.marker, "w").close()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(2)  # the script's own work (tokenizing, say): no training loop to save at
    trainer.train()
    write_results(trainer, options.results)


if __name__ == "__main__":
    main()
