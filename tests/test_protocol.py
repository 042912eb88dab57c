"""The rules of the typed work orders and results (protocol.py), without Ray: which order needs which field,
that they cannot change after they are made (a copy can), and that they survive pickling as Ray sends them."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from raytrainer.protocol import (
    DatasetOrder,
    EvaluateOrder,
    EvaluateResult,
    JobKind,
    LogLevels,
    PredictOrder,
    PredictResult,
    TrainOrder,
    TrainResult,
    WorkOrder,
)


def test_each_order_names_its_call_and_needs_its_own_fields():
    train = TrainOrder(run_id="abc123")
    assert train.job_kind is JobKind.TRAIN and train.resume_from is None
    assert EvaluateOrder(dataset=[1], prefix="eval").job_kind is JobKind.EVALUATE
    assert PredictOrder(dataset=[1], prefix="test").job_kind is JobKind.PREDICT
    with pytest.raises(TypeError, match="run_id"):
        TrainOrder()  # a run without an id
    with pytest.raises(ValueError, match="run id"):
        TrainOrder(run_id="")
    with pytest.raises(TypeError, match="dataset"):
        EvaluateOrder(prefix="eval")
    with pytest.raises(TypeError, match="prefix"):
        PredictOrder(dataset=[1])
    with pytest.raises(TypeError):
        TrainOrder("abc123")  # keyword only: an order reads as what it asks
    assert isinstance(train, WorkOrder) and not isinstance(train, DatasetOrder)
    assert not isinstance(PredictOrder(dataset=[1], prefix="test"), EvaluateOrder)


def test_orders_are_frozen_and_a_copy_names_another_dataset():
    order = EvaluateOrder(dataset="rows", prefix="eval_a", ignore_keys=["past_key_values"],
                          control_points={"evaluate"}, rank_callbacks=[print])
    with pytest.raises(dataclasses.FrozenInstanceError):
        order.dataset = "other"
    assert order.control_points == frozenset({"evaluate"}) and order.rank_callbacks == (print,)
    assert order.ignore_keys == ["past_key_values"]  # as the user gave them: prediction_step sees the same
    moved = dataclasses.replace(order, dataset="ref")
    assert moved.dataset == "ref" and order.dataset == "rows" and moved.prefix == "eval_a"
    assert moved.job_kind is JobKind.EVALUATE


def test_the_log_level_of_each_rank():
    levels = LogLevels(rank0="info", replica="warning")
    assert [levels.for_rank(r) for r in (0, 1, 3)] == ["info", "warning", "warning"]
    assert LogLevels().for_rank(0) is None and TrainOrder(run_id="x").log_levels == LogLevels()


def test_a_train_result_says_how_the_run_stopped():
    done = TrainResult(state="{}", model_state={"w": 1}, train_output=(3, 0.5, {}))
    assert done.stopped is None and not done.interrupted
    assert TrainResult(state="{}", model_state=None, train_output=None, stopped="interrupt").interrupted
    assert not TrainResult(state="{}", model_state=None, train_output=None, stopped="preemption").interrupted
    with pytest.raises(ValueError, match="stopped='crash'"):
        TrainResult(state="{}", model_state=None, train_output=None, stopped="crash")
    with pytest.raises(dataclasses.FrozenInstanceError):
        done.model_state = None
    assert dataclasses.replace(done, model_state=None).model_state is None and done.model_state == {"w": 1}


def test_orders_and_results_survive_pickling_as_ray_sends_them():
    for value in (TrainOrder(run_id="r", resume_from="s3://b/run/checkpoint-4", control_points={"step_end"},
                             log_levels=LogLevels("info", "warning")),
                  EvaluateOrder(dataset=[1, 2], prefix="eval", ignore_keys=("cache",)),
                  PredictOrder(dataset=[3], prefix="test"),
                  TrainResult(state="{}", model_state={"w": [1.0]}, train_output=(1, 0.5, {}), stopped="interrupt"),
                  EvaluateResult({"eval_loss": 0.5}), PredictResult(([1], [2], {"test_loss": 0.1}))):
        assert pickle.loads(pickle.dumps(value)) == value
