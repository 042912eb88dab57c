"""The hang watchdog without Ray: when it reports and acts (a fake clock), what it names (a real thread), and
the training loop in the driver process naming a callback that sleeps."""

import threading
import time

import pytest

from raytrainer import Trainer, TrainerCallback, TrainingArguments
from raytrainer.errors import ConfigError
from raytrainer.worker.watchdog import UNWATCHED, WAITING_FOR_A_PEER, Watchdog, current, watching
from tests.models import TokenData, make_model


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def dog_with_records(warn_s=3.0, timeout_s=8.0):
    clock, reports, timeouts = Clock(), [], []
    dog = Watchdog(rank=1, warn_s=warn_s, timeout_s=timeout_s, clock=clock,
                   report=lambda *a: reports.append(a), on_timeout=lambda *a: timeouts.append(a))
    return dog, clock, reports, timeouts


def look(dog, clock, *times):
    for t in times:
        clock.now = t
        dog.check()


def test_a_stall_is_reported_past_warn_s_again_every_warn_s_and_acted_on_past_timeout_s():
    dog, clock, reports, timeouts = dog_with_records()
    dog.phase("on_step_end (callbacks, control)")
    look(dog, clock, 0, 1, 2)
    assert reports == []
    look(dog, clock, 3)
    assert len(reports) == 1
    rank, phase, seconds = reports[0]
    assert rank == 1 and phase.startswith("on_step_end (callbacks, control) at ") and seconds == 3
    look(dog, clock, 4, 5)
    assert len(reports) == 1  # once per warn_s, not once per look
    look(dog, clock, 6)
    assert len(reports) == 2 and timeouts == []
    look(dog, clock, 7, 8)
    assert len(timeouts) == 1 and timeouts[0][0] == 1 and timeouts[0][2] == 8


def test_a_rank_waiting_in_a_collective_gives_its_stalled_peer_a_quarter_of_the_timeout_to_end_first():
    # Its stall began when it entered the phase, maybe before the peer's: exiting first would name the
    # collective as the restart's cause instead of the peer's line.
    dog, clock, reports, timeouts = dog_with_records(warn_s=3.0, timeout_s=8.0)
    dog.describe = lambda phase: f"{phase} at distributed_c10d.py:3252 (all_reduce) ({WAITING_FOR_A_PEER})"
    dog.phase("on_step_end (callbacks, control)")
    look(dog, clock, 0, 3, 6, 8, 9)
    assert timeouts == [] and len(reports) == 3  # still reported at 3, 6 and 9 s
    look(dog, clock, 10)
    assert len(timeouts) == 1 and timeouts[0][2] == 10 and WAITING_FOR_A_PEER in timeouts[0][1]


def test_a_new_mark_is_progress_even_with_the_same_phase_name():
    dog, clock, reports, timeouts = dog_with_records()
    for t in range(20):  # a step per second, every look sees the same phase name
        dog.phase("forward/backward")
        look(dog, clock, t)
    assert reports == [] and timeouts == []


def test_idle_is_never_a_stall_and_zero_turns_each_limit_off():
    dog, clock, reports, timeouts = dog_with_records()
    dog.idle()
    look(dog, clock, 0, 100, 10_000)
    assert reports == [] and timeouts == []

    dog, clock, reports, timeouts = dog_with_records(warn_s=0.0, timeout_s=8.0)
    dog.phase("checkpoint save")
    look(dog, clock, 0, 7)
    assert reports == [] and timeouts == []
    look(dog, clock, 8)
    assert len(timeouts) == 1

    dog, clock, reports, timeouts = dog_with_records(warn_s=3.0, timeout_s=0.0)
    dog.phase("checkpoint save")
    look(dog, clock, 0, 3, 100)
    assert len(reports) == 2 and timeouts == []  # at 3 s, then once more: warn_s multiples seen at a look


def test_the_thread_names_the_line_the_stalled_thread_is_on():
    reports = []
    dog = Watchdog(rank=0, warn_s=0.2, timeout_s=0.0, poll_s=0.05, report=lambda *a: reports.append(a))
    dog.phase("callback on_step_end")
    dog.start()
    try:
        sleeping_callback()
    finally:
        dog.stop()
    assert reports, "no stall reported"
    rank, phase, seconds = reports[0]
    assert rank == 0 and seconds >= 0.2
    assert phase.startswith("callback on_step_end at ") and "test_watchdog.py" in phase
    assert "(sleeping_callback)" in phase


def sleeping_callback():
    time.sleep(0.6)


def test_a_mark_costs_an_attribute_store():
    """No lock, no clock: a million marks take well under a second (about 0.1 s on a laptop)."""
    dog = Watchdog(rank=0, warn_s=1.0, timeout_s=2.0)
    started = time.perf_counter()
    for _ in range(1_000_000):
        dog.phase("forward/backward")
    assert time.perf_counter() - started < 2.0
    assert not any(t.name == "raytrainer-watchdog" for t in threading.enumerate())  # never started here


def test_watching_is_process_wide_nests_and_ends_idle():
    args = TrainingArguments(output_dir="unused", hang_warning_s=5, hang_timeout_s=10)
    assert current() is UNWATCHED
    with watching(args, rank=3, exit_on_timeout=False) as dog:
        assert current() is dog and dog.rank == 3 and dog.on_timeout is None  # in process: never exits
        with watching(args, rank=3, exit_on_timeout=True) as inner:
            assert inner is dog
    assert current() is UNWATCHED and dog.mark is None
    off = TrainingArguments(output_dir="unused", hang_warning_s=0, hang_timeout_s=0)
    with watching(off, rank=0, exit_on_timeout=True) as dog:
        assert dog is UNWATCHED


@pytest.mark.parametrize("fields, message", [
    (dict(hang_warning_s=-1), "hang_warning_s=-1 must be >= 0"),
    (dict(hang_timeout_s=float("nan")), "hang_timeout_s=nan must be >= 0"),
    (dict(hang_warning_s=60, hang_timeout_s=30), "hang_timeout_s=30 must be above hang_warning_s=60"),
])
def test_the_limits_are_checked_naming_the_fix(fields, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        TrainingArguments(output_dir="unused", **fields)
    TrainingArguments(output_dir="unused", hang_warning_s=60, hang_timeout_s=0)  # a warning alone is fine


class SleepsAtStep(TrainerCallback):
    on_every_rank = True

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            time.sleep(2.5)


def test_the_loop_in_process_names_the_callback_and_only_warns(tmp_path, capfd):
    args = TrainingArguments(output_dir=str(tmp_path / "out"), num_workers=0, per_device_train_batch_size=4,
                             max_steps=3, save_strategy="no", disable_tqdm=True, hang_warning_s=1,
                             hang_timeout_s=1.5)  # num_workers=0: past the timeout it still only warns
    output = Trainer(model=make_model(), args=args, train_dataset=TokenData(16), callbacks=[SleepsAtStep()]).train()
    assert output.global_step == 3
    err = capfd.readouterr().err
    assert "[raytrainer] rank 0 has made no progress for " in err  # through the sink (DirectSink here)
    assert "in on_step_end (callbacks, control) at " in err and "(on_step_end)" in err and "test_watchdog.py" in err
    assert current() is UNWATCHED


def test_a_function_shipped_from_the_driver_script_is_located_in_its_file():
    """cloudpickle names the code of a function it ships by value "<dynamic-code>"; the stall line names the
    script's file from the function's globals instead."""
    import sys
    import types

    import cloudpickle

    from raytrainer.worker.watchdog import source_file

    script = types.ModuleType("users_script")
    script.__file__ = "/home/user/train.py"
    exec("import sys\ndef where():\n    return sys._getframe()\n", script.__dict__)
    sys.modules["users_script"] = script
    try:
        cloudpickle.register_pickle_by_value(script)
        shipped = cloudpickle.loads(cloudpickle.dumps(script.where))
    finally:
        cloudpickle.unregister_pickle_by_value(script)
        del sys.modules["users_script"]
    frame = shipped()
    assert frame.f_code.co_filename == "<dynamic-code>"
    assert source_file(frame) == "/home/user/train.py"
