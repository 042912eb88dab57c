"""Preemption and Ctrl-C in the hosted mode, on the session's Ray: an unmodified transformers script
(stops_script.py: dropout on, a constant learning rate, no periodic checkpoint before its last step) on 2
workers. Every rank saves at the first exchange step after the request, the checkpoint commits, then the run
continues (a SIGTERM to a worker: a preemption, with no failure allowed) or stops (Ctrl-C: `raytrainer launch`
says which checkpoint holds the run and exits with 130; the same command continues). Both end with the weights
of the uninterrupted run. The drivers run in this process, on the pool's warm group (a subprocess driver would
start a group of its own); SIGINT goes to this process, where the driver's handler is. The Python API
(`raytrainer.hosted`) stops the same way, with KeyboardInterrupt raised from train()."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from transformers import Trainer, TrainerCallback

import raytrainer
from raytrainer.callbacks.progress import ProgressCallback
from raytrainer.checkpoint.listing import list_checkpoints
from raytrainer.cli.commands import main as raytrainer_main
from raytrainer.worker.hosted.stops import MAX_EVERY
from tests.hosted.plain_script import Rows, save_results, stops_arguments, tiny_llama
from tests.hosted.test_launch_on_ray import assert_same_run
from tests.support import wait_for

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stops_script.py")
AT = 4  # the step at whose end the stop is asked for
# Every rank saves at the first exchange step after AT (worker/hosted/stops.py: about 0.2 s of steps apart, at
# most MAX_EVERY), or at the one after it when the request comes in during that step (the flag raised in Ray's
# main thread once it next gets the GIL): never at AT or before, and before the run's end.
SAVED_AT = range(AT + 1, AT + 2 + MAX_EVERY)
STEPS = SAVED_AT[-1] + 2


def script_args(output_dir: str, results: str, *extra: str) -> list:
    return ["--output_dir", output_dir, "--results", results, "--max_steps", str(STEPS), *extra]


def ctrl_c_once(marker):
    """SIGINT to this process (the driver's handler, coordinator/pump.py, takes it) once `marker` exists."""
    def send():
        # Not there in 120 s: the run failed before the pause, and the test's assertions say how.
        if wait_for(marker.exists, 120, every_s=0.05):
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=send, daemon=True).start()


def committed(output_dir: str) -> list:
    return [(os.path.basename(i.url), i.committed) for i in list_checkpoints(output_dir)]


def stop_step(output_dir: str) -> int:
    """The step of the run's first checkpoint: the stop's (no periodic one comes before the last step)."""
    first = list_checkpoints(output_dir)[0]
    assert first.committed, first
    return int(first.url.rsplit("-", 1)[1])


@pytest.fixture(scope="module")
def reference(tmp_path_factory, ray_session):
    root = tmp_path_factory.mktemp("uninterrupted")
    result = raytrainer.launch(SCRIPT, script_args(str(root / "run"), str(root / "results")), num_workers=2,
                               disable_tqdm=True)
    assert [r["global_step"] for r in result.runs] == [STEPS]
    return str(root / "results")


def test_a_sigterm_to_a_worker_saves_at_the_next_exchange_step_and_the_run_goes_on_as_a_preemption(
        reference, tmp_path, capfd):
    """Rank 1 sends itself SIGTERM at step 4's end with max_failures=0: both ranks save at the next exchange step,
    Ray Train restarts the group counting a preemption, and the script's Trainer resumes from that checkpoint."""
    output_dir, results = str(tmp_path / "run"), str(tmp_path / "results")
    # max_preemptions left at its default (no limit): a group's max_preemptions is Ray Train's, part of its shape,
    # and the default keeps the reference's warm group (a group start fewer)
    result = raytrainer.launch(SCRIPT, script_args(output_dir, results, "--sigterm_at", str(AT), "--marker",
                                                   str(tmp_path / "sigterm")),
                               num_workers=2, disable_tqdm=True, max_failures=0)
    assert os.path.exists(tmp_path / "sigterm") and result.runs[-1]["global_step"] == STEPS
    saved = stop_step(output_dir)
    assert saved in SAVED_AT and committed(output_dir) == [(f"checkpoint-{saved}", True),
                                                           (f"checkpoint-{STEPS}", True)]
    out = capfd.readouterr().out
    assert f"checkpoint of step {saved} committed" in out and "Ray Train restarts the worker group" in out, out
    with open(os.path.join(output_dir, f"checkpoint-{STEPS}", "trainer_state.json")) as f:
        restarts = json.load(f)["stateful_callbacks"]["raytrainer"]["restarts"]
    assert [(r["reason"], r["global_step"], os.path.basename(r["checkpoint"])) for r in restarts] == [
        ("preemption", saved, f"checkpoint-{saved}")]
    assert_same_run(results, reference)


def test_ctrl_c_on_launch_saves_at_the_next_exchange_step_exits_130_and_the_same_command_continues(
        reference, tmp_path, capfd):
    """`raytrainer launch` (its entry point, in this process) gets SIGINT while rank 0 pauses at step 4's end:
    both ranks save at the next exchange step, the command prints the line naming the checkpoint and returns 130.
    The same command again resumes there and ends with the uninterrupted weights."""
    output_dir, results, marker = str(tmp_path / "run"), str(tmp_path / "results"), tmp_path / "paused"
    command = ["launch", "--num_workers", "2", "--disable_tqdm", SCRIPT,
               *script_args(output_dir, results, "--pause_at", str(AT), "--pause_s", "3", "--marker", str(marker))]

    ctrl_c_once(marker)
    assert raytrainer_main(command) == 130
    out = capfd.readouterr().out
    saved = stop_step(output_dir)
    assert saved in SAVED_AT and committed(output_dir) == [(f"checkpoint-{saved}", True)]
    assert f"interrupted: saved checkpoint-{saved} (in {output_dir}); run the same command to continue" in out, out
    assert not os.path.exists(results)  # the script's code after train() did not run

    assert raytrainer_main(command) == 0
    assert committed(output_dir) == [(f"checkpoint-{saved}", True), (f"checkpoint-{STEPS}", True)]
    assert_same_run(results, reference)


class PauseOnce(TrainerCallback):
    """Rank 0 pauses at step AT's end, once (the marker file): the test's moment to Ctrl-C the driver."""

    def __init__(self, marker: str):
        self.marker = marker

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == AT and int(os.environ.get("RANK", 0)) == 0 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            time.sleep(3)


def test_ctrl_c_in_the_python_api_saves_raises_keyboard_interrupt_and_train_again_continues(reference, tmp_path,
                                                                                            capfd):
    """`raytrainer.hosted(Trainer)(...).train()` (the stop script's model, data and arguments, with the progress
    bar on) gets SIGINT while rank 0 pauses: both ranks save at the next exchange step, train() prints the line and
    raises KeyboardInterrupt, the driver's bar is closed (left open, tqdm failed at the interpreter's exit). A
    new Trainer's train() on the same output_dir continues there and ends with the uninterrupted weights."""
    output_dir, marker = str(tmp_path / "run"), tmp_path / "paused"

    def build(**options):
        args = stops_arguments(output_dir, STEPS)
        return raytrainer.hosted(Trainer, num_workers=2, **options)(
            model=tiny_llama(attention_dropout=0.2), args=args, train_dataset=Rows(),
            callbacks=[PauseOnce(str(marker))])

    trainer = build(disable_tqdm=False)
    ctrl_c_once(marker)
    with pytest.raises(KeyboardInterrupt):
        trainer.train()
    saved = stop_step(output_dir)
    assert saved in SAVED_AT and committed(output_dir) == [(f"checkpoint-{saved}", True)]
    out = capfd.readouterr()
    assert f"interrupted: saved checkpoint-{saved} (in {output_dir}); train() again continues from it" in out.out
    assert "train:" in out.err  # the bar was shown, and is closed now
    assert [c.bar for c in trainer.callback_handler.callbacks if isinstance(c, ProgressCallback)] == [None]

    again = build()  # the arguments' disable_tqdm=True: no bar
    again.train()
    assert "train:" not in capfd.readouterr().err
    assert committed(output_dir) == [(f"checkpoint-{saved}", True), (f"checkpoint-{STEPS}", True)]
    results = str(tmp_path / "results")
    save_results(again.state.log_history, again.model, results)
    assert_same_run(results, reference)
