"""The driver of test_ray_data_two_cpus.py: Ray Data as a user writes it, on a Ray of 2 CPUs that this process
starts (a 2-core laptop), with 2 workers. `python ray_data_two_cpus.py OUT_DIR`.

1. 203 rows of `ray.data.from_items` (Ray knows the length: padded to 204, 2 epochs);
2. the same rows through a `map_batches` at its defaults (1 CPU per task; the length unknown: max_steps);
3. a pipeline whose step asks 2 CPUs when it runs for the training's split (through `ray_remote_args_fn`, which
   preflight cannot read; the driver's 2-row check of it asks 1): it can never run beside the workers, and the
   driver must say so. The test ends this process once it has.

Every trained micro-batch's row ids go to OUT_DIR/<run>/rows.<pid> ("epoch id id ..."), written on the workers."""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
import ray

from raytrainer import Trainer, TrainingArguments
from tests.models import VOCAB, make_model

ROWS = 203


def tokenize(batch):
    idx = batch["idx"]
    ids = (idx[:, None] * 7 + np.arange(6)[None, :]) % VOCAB
    return {"idx": idx, "input_ids": ids, "labels": (ids + 1) % VOCAB}


class CountsRows(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # In a run only (not the driver's 2-sample check), and not on a rank's zero-weight filler batch.
        if getattr(self, "_loop", None) is not None and self._loss_weight:
            ids = " ".join(str(int(i)) for i in inputs["idx"])
            with open(os.path.join(self.rows_dir, f"rows.{os.getpid()}"), "a") as f:
                f.write(f"{self.state.epoch_index} {ids}\n")
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def train(out: str, name: str, dataset, **overrides):
    args = TrainingArguments(output_dir=os.path.join(out, name), num_workers=2, per_device_train_batch_size=32,
                             num_train_epochs=2, save_strategy="no", logging_steps=1, learning_rate=5e-2, seed=3,
                             disable_tqdm=True, report_to="none", **overrides)
    trainer = CountsRows(model=make_model(), args=args, train_dataset=dataset)
    trainer.rows_dir = os.path.join(out, name)
    os.makedirs(trainer.rows_dir, exist_ok=True)
    output = trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    print("RESULT " + json.dumps({"run": name, "steps": output.global_step, "losses": losses, "at": time.time(),
                                  "cpu_per_worker": args.resources_per_worker}), flush=True)


def main(out: str):
    # As raytrainer's own embedded Ray (coordinator/cluster.py), with 2 CPUs whatever this machine has.
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING",
             runtime_env={"env_vars": {"RAY_TRAIN_V2_ENABLED": "1", "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0"}})
    tokens = tokenize({"idx": np.arange(ROWS)})
    train(out, "padded", ray.data.from_items([{k: v[i] for k, v in tokens.items()} for i in range(ROWS)]))
    ids = ray.data.from_items([{"idx": i} for i in range(ROWS)])
    train(out, "mapped", ids.map_batches(tokenize), max_steps=5)  # 4 steps an epoch: past the first epoch's end
    train(out, "unplaceable", ids.map_batches(tokenize, ray_remote_args_fn=two_cpus_in_the_split), max_steps=4)


def two_cpus_in_the_split() -> dict:
    """2 CPUs where Ray Data runs in an actor (the split's coordinator), 1 on the driver (preflight's sample)."""
    return {"num_cpus": 2 if ray.get_runtime_context().get_actor_id() else 1}


if __name__ == "__main__":
    main(sys.argv[1])
