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

from plain_script import (  # this folder is first on sys.path, as for `python stops_script.py`
    Rows,
    stops_arguments,
    tiny_llama,
    write_results,
)
from transformers import Trainer, TrainerCallback


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
    trainer = Trainer(model=tiny_llama(attention_dropout=0.2), args=stops_arguments(options.output_dir,
                                                                                   options.max_steps),
                      train_dataset=Rows(), callbacks=[Faults(options)])
    if options.sigterm_before_train and int(os.environ.get("RANK", 0)) == options.sigterm_rank \
            and not os.path.exists(options.marker):
        open(options.marker, "w").close()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(2)  # the script's own work (tokenizing, say): no training loop to save at
    trainer.train()
    write_results(trainer, options.results)


if __name__ == "__main__":
    main()
