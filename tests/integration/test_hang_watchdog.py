"""The hang watchdog on real Ray: rank 1 sleeps in an `on_every_rank` callback at one step. Within
hang_warning_s (3 s) the console names rank 1, the hook and the line; past hang_timeout_s (15 s: on a loaded
2-core machine ordinary phases stall for several seconds) the stalled worker exits, Ray Train restarts the
group (one failure against max_failures) and the run ends from its newest committed checkpoint."""

import os
import time

import pytest
import torch.distributed as dist

from raytrainer import Trainer, TrainerCallback, TrainingArguments
from tests.models import TokenData, make_model

pytestmark = pytest.mark.usefixtures("ray_session")
STALL_AT = 3


class StallsOnce(TrainerCallback):
    """On rank 1, at STALL_AT, once (a marker file survives the restart): far longer than the timeout."""
    on_every_rank = True

    def __init__(self, marker: str):
        self.marker = marker

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == STALL_AT and dist.get_rank() == 1 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            time.sleep(120)


def test_a_rank_stalled_in_a_callback_is_named_then_its_group_restarts(tmp_path, capfd):
    args = TrainingArguments(output_dir=str(tmp_path / "out"), num_workers=2, per_device_train_batch_size=4,
                             max_steps=6, save_steps=2, learning_rate=1e-2, logging_steps=3, disable_tqdm=True,
                             max_failures=1, hang_warning_s=3, hang_timeout_s=15)
    marker = str(tmp_path / "stalled")
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(48), callbacks=[StallsOnce(marker)])
    output = trainer.train()
    assert os.path.exists(marker), "the stall never happened"
    assert output.global_step == 6
    assert len(trainer.state.restarts) == 1  # one failure, counted against max_failures=1
    restart = trainer.state.restarts[0]
    assert restart["global_step"] == 2  # resumed from checkpoint-2
    # The restart record says why: the stall the watchdog named, with its file, not Ray's health check.
    assert restart["reason"] == "hang" and "rank 1 made no progress for" in restart["cause"], restart
    assert "on_step_end" in restart["cause"] and "test_hang_watchdog.py" in restart["cause"], restart

    err = capfd.readouterr().err
    named = [line for line in err.splitlines() if "rank 1 has made no progress for" in line  # stderr or the sink
             and "in on_step_end (callbacks, control) at " in line]
    assert named, err[-3000:]
    assert "test_hang_watchdog.py" in named[0] and "(on_step_end)" in named[0]
    assert float(named[0].split(" has made no progress for ")[1].split(" s ")[0]) < 15  # named before the timeout
    assert "past hang_timeout_s, this worker exits" in err
