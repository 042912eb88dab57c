"""A driver for the elastic and preemption tests, run in its own process against the local cluster.

    python -m tests.integration.cluster.elastic_script WORK_DIR SCENARIO      (RAY_ADDRESS names the local cluster)

The workers and the test talk through files in WORK_DIR (instance attributes travel to the workers;
every process here shares the disk):
- every micro-batch a worker trains on is appended to seen-<pid>.jsonl: step, world size, the step its
  group started from, its node, sample ids, time; the test keeps, for each step, only the group that ran it last;
- "shrink-grow": at step 5 with 2 workers rank 0 writes `paused-2` and waits (the test removes a node:
  the group dies, Ray Train restarts it with 1 worker); at step 9 with 1 worker it writes `paused-1` and
  waits (the test adds a node back: Ray Train's elastic monitor restarts the group with 2). Each pause
  waits for the previous checkpoint to be committed first, and ends by itself after 120 s (the test then
  fails on the missing resize rather than hanging). Then, grown back to 2 workers, rank 1 sends SIGTERM to
  its own process during step 13, once: a preemption, which every rank saves at a step boundary.
The result (weights, trainer state) goes to WORK_DIR/result.pt.
"""

import json
import os
import signal
import sys
import time

import ray
import torch

from raytrainer import Trainer, TrainingArguments
from raytrainer.checkpoint.manifest import is_committed
from raytrainer.storage import join
from tests.models import TokenData, make_model

STEPS, SAMPLES, SAVE_STEPS = 18, 48, 4  # global batch 8: 6 steps per epoch, 3 epochs
PAUSES = {2: 5, 1: 9}  # world size -> the step during which the shrink-grow run pauses at that size
PAUSE_LIMIT_S = 120
SIGTERM_AT = 13  # the step during which rank 1 of the regrown group sends itself SIGTERM


def training_args(output_dir, scenario):
    # max_failures=1: the node loss is the one failure; a preemption counted as a failure would end the run.
    return TrainingArguments(
        output_dir=output_dir, num_workers=(1, 2), per_device_train_batch_size=4, max_steps=STEPS,
        save_steps=SAVE_STEPS, learning_rate=1e-2, optim="adamw_torch", logging_steps=4, disable_tqdm=True, seed=5,
        max_failures=1, elastic_resize_monitor_interval_s=2.0, allow_local_output_dir_on_multinode=True)


class Probe(Trainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        step, world = self.state.global_step + 1, self.ctx.world_size
        self._record(step, world, inputs)
        if self.scenario == "shrink-grow" and self.ctx.rank == 0 and PAUSES.get(world) == step:
            self._pause(step, world)
        if world == 2 and self.ctx.rank == 1 and step == SIGTERM_AT and not self._flag("sigterm-sent"):
            open(os.path.join(self.work, "sigterm-sent"), "w").close()
            os.kill(os.getpid(), signal.SIGTERM)
        return super().training_step(model, inputs, num_items_in_batch)

    def _record(self, step, world, inputs):
        if not hasattr(self, "_start"):
            self._start = self.state.global_step  # the step this worker group started from
        with open(os.path.join(self.work, f"seen-{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps({"step": step, "world": world, "start": self._start, "rank": self.ctx.rank,
                                "node": ray.get_runtime_context().get_node_id(),
                                "padding": self._loss_weight == 0, "idx": inputs["idx"].tolist(),
                                "time": time.time()}) + "\n")

    def _pause(self, step, world):
        marker = f"paused-{world}"
        if self._flag(marker):
            return
        previous = join(self.args.output_dir, f"checkpoint-{step - 1}")
        while not is_committed(previous):
            time.sleep(0.05)
        open(os.path.join(self.work, marker), "w").close()
        deadline = time.time() + PAUSE_LIMIT_S
        while time.time() < deadline:  # Ray Train ends this group (node lost, or the resize) long before
            time.sleep(0.2)

    def _flag(self, name):
        return os.path.exists(os.path.join(self.work, name))


def main():
    work, scenario = sys.argv[1], sys.argv[2]
    trainer = Probe(model=make_model(), args=training_args(os.path.join(work, "run"), scenario),
                    train_dataset=TokenData(SAMPLES))
    trainer.work, trainer.scenario = work, scenario  # instance attributes travel to the workers
    output = trainer.train()
    torch.save({"weights": trainer.model.state_dict(), "global_step": output.global_step,
                "restarts": trainer.state.restarts, "resizes": trainer.state.resizes}, os.path.join(work, "result.pt"))


if __name__ == "__main__":
    main()
