"""A training run in its own process, for tests that kill the driver or crash in the middle of a save.

    python -m tests.resume_script OUTPUT_DIR RESULT_FILE [--resume] [--storage-options JSON]
        [--crash-before-commit STEP] [--sleep-per-step S] [--random]

--crash-before-commit makes the process die (os._exit) after every file of checkpoint STEP is written but
before its commit marker: the worst moment for a crash.
"""

import argparse
import json
import os
import time

import torch

from raytrainer import Trainer, TrainingArguments
from raytrainer.checkpoint import manifest
from tests.models import MaskingCollator, TokenData, make_model as make_plain_model

STEPS, SAVE_STEPS = 12, 4
DROPOUT = 0.2  # --random: dropout and a random collator; resume must continue every stream (principle 3)


def make_model(random: bool = False):
    return make_plain_model(dropout=DROPOUT if random else 0.0)


def collator(random: bool = False):
    return MaskingCollator() if random else None


def training_args(output_dir, storage_options=None, num_workers=0, **extra):
    # per-device batch 8 on one process, 4 on two: the same global batches, so the same weights.
    return TrainingArguments(output_dir=output_dir, storage_options=storage_options, num_workers=num_workers,
                             per_device_train_batch_size=8 // max(num_workers, 1), max_steps=STEPS,
                             save_steps=SAVE_STEPS,
                             learning_rate=1e-2, optim="adamw_torch", logging_steps=4, disable_tqdm=True,
                             seed=11, **extra)


class SlowTrainer(Trainer):
    sleep_per_step = 0.0
    seen_path = None  # in-process runs only: class attributes set at run time stay on the driver

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.seen_path:
            with open(self.seen_path, "a") as f:
                f.write(json.dumps({"step": self.state.global_step + 1, "idx": inputs["idx"].tolist()}) + "\n")
        time.sleep(self.sleep_per_step)
        return super().training_step(model, inputs, num_items_in_batch)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("output_dir")
    parser.add_argument("result")
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--storage-options", default=None)
    parser.add_argument("--crash-before-commit", type=int, default=None)
    parser.add_argument("--sleep-per-step", type=float, default=0.0)
    parser.add_argument("--seen", default=None)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--random", action="store_true", help="dropout and a random (masking) collator")
    opts = parser.parse_args()
    if opts.crash_before_commit is not None:
        real_commit = manifest.commit

        def crashing_commit(url, step, *args, **kwargs):
            if step == opts.crash_before_commit:
                os._exit(17)
            return real_commit(url, step, *args, **kwargs)

        manifest.commit = crashing_commit
    SlowTrainer.seen_path = opts.seen
    storage_options = json.loads(opts.storage_options) if opts.storage_options else None
    trainer = SlowTrainer(model=make_model(opts.random),
                          args=training_args(opts.output_dir, storage_options, num_workers=opts.num_workers),
                          train_dataset=TokenData(44), data_collator=collator(opts.random))
    trainer.sleep_per_step = opts.sleep_per_step  # an instance attribute travels to Ray workers
    output = trainer.train(resume_from_checkpoint=True if opts.resume else None)
    torch.save({"weights": trainer.model.state_dict(), "global_step": output.global_step,
                "restarts": trainer.state.restarts}, opts.result)


if __name__ == "__main__":
    main()
