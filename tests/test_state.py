"""The trainer state (raytrainer/state.py): HF's `TrainerState` fields, a trainer_state.json transformers loads,
raytrainer's own fields (the data position, restarts, resizes, start-up) kept inside `stateful_callbacks` so they
survive a round trip, and `EvalPrediction` unpacked as HF's."""

import dataclasses
import json

import numpy as np
import pytest
import torch

from raytrainer.state import OWN_STATE_KEY, EvalPrediction, TrainerState

transformers = pytest.importorskip("transformers")


def test_the_fields_are_transformers_fields_in_its_order():
    ours = [f.name for f in dataclasses.fields(TrainerState)]
    theirs = [f.name for f in dataclasses.fields(transformers.TrainerState)]
    assert ours == theirs


def test_a_state_file_loads_in_transformers_and_keeps_our_fields_on_a_round_trip(tmp_path):
    state = TrainerState(global_step=12, epoch=1.5, max_steps=20, best_metric=np.float32(0.25),
                         log_history=[{"step": 10, "loss": torch.tensor(1.5), "grad_norm": np.float64(0.5)}])
    state.samples_seen_in_epoch, state.epoch_index = 96, 1
    state.restarts.append({"step": 8, "reason": "preemption"})
    state.startup = {"total_s": 3.5}
    text = state.to_json_string()
    (tmp_path / "trainer_state.json").write_text(text)
    theirs = transformers.TrainerState.load_from_json(str(tmp_path / "trainer_state.json"))
    assert (theirs.global_step, theirs.epoch, theirs.best_metric) == (12, 1.5, 0.25)
    assert theirs.log_history == [{"step": 10, "loss": 1.5, "grad_norm": 0.5}]  # numbers, not strings
    assert theirs.stateful_callbacks[OWN_STATE_KEY]["samples_seen_in_epoch"] == 96
    back = TrainerState.from_json_string(text)
    assert (back.samples_seen_in_epoch, back.epoch_index, back.startup) == (96, 1, {"total_s": 3.5})
    assert back.restarts == [{"step": 8, "reason": "preemption"}] and back.resizes == []


def test_a_file_with_fields_this_version_does_not_know_still_loads():
    """A trainer_state.json written by a newer transformers (a field added there) is read, the field dropped."""
    data = json.loads(TrainerState(global_step=3).to_json_string())
    data["a_field_of_a_later_transformers"] = {"x": 1}
    back = TrainerState.from_json_string(json.dumps(data))
    assert back.global_step == 3 and not hasattr(back, "a_field_of_a_later_transformers")
    assert back.samples_seen_in_epoch == 0  # an HF file without our fields: the start of an epoch


def test_eval_prediction_unpacks_as_transformers_does():
    preds, labels = np.zeros((2, 3)), np.array([1, 2])
    ours = EvalPrediction(preds, labels)
    theirs = transformers.EvalPrediction(predictions=preds, label_ids=labels)
    p, la = ours
    assert p is preds and la is labels and ours[0] is preds and ours[1] is labels
    assert [x is y for x, y in zip(ours, theirs)] == [True, True]


def test_save_to_json_and_load_from_json_as_transformers_names_them(tmp_path):
    """transformers' TrainerState.save_to_json / load_from_json (scripts read a checkpoint's trainer_state.json
    with them): ours write what transformers loads, and read what transformers writes."""
    ours = TrainerState(global_step=7, epoch=1.5, best_metric=0.25, log_history=[{"loss": 1.0, "step": 7}])
    ours.save_to_json(str(tmp_path / "ours.json"))
    assert TrainerState.load_from_json(str(tmp_path / "ours.json")) == ours
    assert transformers.TrainerState.load_from_json(str(tmp_path / "ours.json")).global_step == 7
    transformers.TrainerState(global_step=3, max_steps=9).save_to_json(str(tmp_path / "theirs.json"))
    theirs = TrainerState.load_from_json(str(tmp_path / "theirs.json"))
    assert (theirs.global_step, theirs.max_steps) == (3, 9)
