"""The line the driver shows while train() starts (raytrainer/startup_line.py): its words follow the driver's
phases, it goes at the run's first event, and a quick start shows nothing. The real phases are driven here by
hand, on the real Startup; an in-process train() shows it end to end."""

import io
import time
import types

from raytrainer import Trainer, TrainingArguments
from raytrainer.coordinator.handlers import StartupWatch
from raytrainer.startup import Startup
from raytrainer.startup_line import StartupLine
from tests.models import TokenData, make_model
from tests.support import wait_for


def test_on_a_terminal_one_line_redrawn_with_the_phase_then_cleared_at_the_first_event():
    startup, out = Startup(), io.StringIO()
    with StartupLine(startup, stream=out, tty=True, after_s=0.05, every_s=0.01):
        for name in ("preflight", "pack", "group", "object store"):
            startup.driver.mark(name)
        startup.group = "new"
        startup.driver.mark("sink start")
        assert wait_for(lambda: "starting the workers" in out.getvalue())
        startup.on_event({"kind": "train_begin"})  # the run's first event: the progress bar's turn
        shown = out.getvalue()
        time.sleep(0.05)
        assert out.getvalue() == shown  # nothing drawn after it
    assert shown.endswith("\r\x1b[K") and "\n" not in shown  # cleared; one line, never a new one
    assert "[raytrainer] starting: starting the workers (placement, processes, imports, process group)..." in shown


def test_in_a_log_each_slow_phase_once_as_its_own_line_and_nothing_for_a_quick_one():
    startup, out = Startup(), io.StringIO()
    with StartupLine(startup, stream=out, tty=False, after_s=0.1, every_s=0.01):
        startup.doing = "connecting to Ray"
        time.sleep(0.3)
        startup.driver.mark("preflight")  # packing: over before after_s
        startup.group = "reused"
        startup.driver.mark("sink start")
        time.sleep(0.3)
    lines = out.getvalue().splitlines()
    assert [line.split("...")[0] for line in lines] == [
        "[raytrainer] starting: connecting to Ray",
        "[raytrainer] starting: the workers are setting up (model, data, optimizer, checkpoint)"]


def test_train_in_process_with_the_bar_on_prints_no_start_up_line_when_start_up_is_quick(tmp_path, capsys):
    args = TrainingArguments(output_dir=str(tmp_path), num_workers=0, max_steps=2, save_strategy="no",
                             report_to="none")
    Trainer(model=make_model(), args=args, train_dataset=TokenData(16)).train()
    assert "starting:" not in capsys.readouterr().err


def test_a_hosted_start_counts_from_the_launch_and_goes_at_its_first_event():
    """The hosted mode (hosting/dispatch_order.py) shows the same line while Ray and its group start; its seconds
    count from the launch (or the call), and its words-only Startup logs no timeline (its ranks send none)."""
    startup, out = Startup(words_only=True), io.StringIO()
    watch = StartupWatch(startup)
    callbacks = types.SimpleNamespace(state=types.SimpleNamespace(startup=None))
    with StartupLine(startup, stream=out, tty=False, after_s=0.05, every_s=0.01, since="the launch"):
        startup.doing = "connecting to Ray"
        assert wait_for(lambda: "connecting to Ray" in out.getvalue())
        assert not watch.reads({"kind": "train_begin"}, callbacks)  # the first event: the line goes
        shown = out.getvalue()
        time.sleep(0.1)
    assert out.getvalue() == shown
    assert shown.startswith("[raytrainer] starting: connecting to Ray... (")
    assert shown.endswith(" s since the launch)\n")
    watch.log(callbacks)
    assert callbacks.state.startup is None and not watch.logged
