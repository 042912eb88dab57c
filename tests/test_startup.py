"""The start-up timeline of train() (raytrainer/startup.py): consecutive phases, logged at INFO as one line
at the first step and kept in trainer.state.startup (trainer_state.json). The 2-worker case is asserted in
tests/integration/test_distributed.py on a run it makes anyway."""

import json
import logging
import os

import pytest

from raytrainer import Trainer, TrainingArguments
from raytrainer.startup import DRIVER_PHASES, WORKER_PHASES, Startup
from raytrainer.state import TrainerState
from tests.models import TokenData, make_model


def assert_consistent(record: dict, group: str):
    """Every phase non-negative, in the documented order, and together no longer than the total."""
    phases = record["phases_s"]
    assert record["group"] == group
    assert all(seconds >= 0 for seconds in phases.values()), phases
    # Each figure is rounded to the millisecond: the rounded phases may exceed the rounded total by half a
    # millisecond apiece (a CI run once saw nine phases summing to 0.024 against a total of 0.023).
    assert sum(phases.values()) <= record["total_s"] + 0.0005 * (len(phases) + 1) + 1e-9, record
    assert set(phases) <= {*DRIVER_PHASES, *WORKER_PHASES, "first step"}  # (trainer_state.json sorts the keys)
    assert {"preflight", "pack", *WORKER_PHASES, "first step"} <= set(phases)
    assert 0 <= record["loss_check_s"] <= phases["preflight"]


def test_the_timeline_adds_the_sinks_stamp_and_rank_0s_phases_to_the_drivers():
    startup = Startup()
    for name in ("preflight", "pack", "group", "object store", "sink start"):
        startup.driver.mark(name)
    startup.loss_check_s, startup.group, startup.posted_at = 0.0, "new", 100.0
    startup.driver.started -= 20  # as if train() had been called 20 s ago
    assert startup.on_event({"kind": "startup", "time": 110.0, "taken_at": 103.0,
                             "phases": {name: 1.0 for name in WORKER_PHASES}})
    assert startup.on_event({"kind": "startup", "time": 150.0, "taken_at": 140.0, "phases": {}})  # a restart's
    assert startup.worker == {name: 1.0 for name in WORKER_PHASES}  # the call's first one counts
    assert not startup.complete
    assert not startup.on_event({"kind": "step_end", "time": 112.5, "global_step": 1})
    assert startup.complete
    record = startup.record()
    assert record["phases_s"]["group start"] == 3.0 and record["phases_s"]["first step"] == 2.5
    assert_consistent(record, "new")
    assert "group start 3.0 (new)" in startup.line() and startup.line().startswith("start-up 20.0 s: preflight")


def test_in_process_train_logs_the_timeline_and_keeps_it_in_trainer_state_json(tmp_path, caplog):
    args = TrainingArguments(output_dir=str(tmp_path), num_workers=0, per_device_train_batch_size=8, max_steps=2,
                             save_strategy="no", disable_tqdm=True, seed=1)
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(32))
    with caplog.at_level(logging.INFO, logger="raytrainer"):
        trainer.train()
    record = trainer.state.startup
    assert_consistent(record, "in process")
    assert "object store" not in record["phases_s"] and "group start" not in record["phases_s"]
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("start-up ")]
    assert len(lines) == 1 and "(loss check " in lines[0] and lines[0].index("unpack") < lines[0].index("first step")
    trainer.evaluate(TokenData(8))  # another call: no timeline of its own, the train() one stays
    assert trainer.state.startup == record
    trainer.save_state()
    path = os.path.join(str(tmp_path), "trainer_state.json")
    with open(path) as f:
        assert json.load(f)["stateful_callbacks"]["raytrainer"]["startup"] == record
    assert TrainerState.from_json_string(open(path).read()).startup == record
    transformers = pytest.importorskip("transformers")
    loaded = transformers.TrainerState.load_from_json(path)
    assert loaded.stateful_callbacks["raytrainer"]["startup"] == record
