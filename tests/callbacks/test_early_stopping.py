"""EarlyStoppingCallback's decisions, called as HF's tests call it (a state, a control, metrics), and checked
against transformers' own callback on the same sequence of evaluations."""

import pytest

from raytrainer import ConfigError, EarlyStoppingCallback, TrainingArguments
from raytrainer.state import TrainerControl, TrainerState


def decisions(callback, args, values):
    """Whether each evaluation in turn stops training."""
    state, out = TrainerState(), []
    callback.on_train_begin(args, state, TrainerControl())
    for value in values:
        control = TrainerControl()
        callback.on_evaluate(args, state, control, metrics={"eval_loss": value, "eval_accuracy": -value})
        out.append(control.should_training_stop)
    return out


def args_for(metric="eval_loss", **kw):
    return TrainingArguments(eval_strategy="steps", eval_steps=1, save_steps=1, load_best_model_at_end=True,
                             metric_for_best_model=metric, **kw)


@pytest.mark.parametrize("patience, threshold, values, expected", [
    (1, 0.0, [1.0, 0.9, 0.95], [False, False, True]),
    (2, 0.0, [1.0, 0.9, 0.95, 0.92], [False, False, False, True]),
    (2, 0.0, [1.0, 1.1, 0.8, 0.85, 0.7], [False, False, False, False, False]),  # improvement resets the count
    (1, 0.05, [1.0, 0.97], [False, True]),   # better, but not by more than the threshold
    (1, 0.05, [1.0, 0.9, 0.88], [False, False, True]),
    (2, 0.05, [1.0, 0.97, 0.96], [False, False, True]),  # small gains still move the best (HF 5)
])
def test_stops_after_patience_evaluations_without_improvement(patience, threshold, values, expected):
    args = args_for()
    assert decisions(EarlyStoppingCallback(patience, threshold), args, values) == expected
    transformers = pytest.importorskip("transformers")
    # HF 5 updates state.best_metric after on_evaluate; replay that with its own callback.
    hf_args = transformers.TrainingArguments(output_dir="x", eval_strategy="steps", load_best_model_at_end=True,
                                             metric_for_best_model="eval_loss", greater_is_better=False)
    hf, state, hf_out = transformers.EarlyStoppingCallback(patience, threshold), transformers.TrainerState(), []
    for value in values:
        control = transformers.TrainerControl()
        hf.on_evaluate(hf_args, state, control, metrics={"eval_loss": value})
        hf_out.append(control.should_training_stop)
        if state.best_metric is None or value < state.best_metric:
            state.best_metric = value
    assert hf_out == expected


def test_greater_is_better_metric():
    args = args_for("accuracy")
    assert args.greater_is_better
    # eval_accuracy = -loss: these losses are accuracies going 0.5 -> 0.6 -> 0.55
    assert decisions(EarlyStoppingCallback(1), args, [-0.5, -0.6, -0.55]) == [False, False, True]


def test_resumed_run_starts_from_the_checkpoint_best():
    callback, args = EarlyStoppingCallback(1), args_for()
    callback.on_train_begin(args, TrainerState(best_metric=0.5), TrainerControl())
    control = TrainerControl()
    callback.on_evaluate(args, TrainerState(best_metric=0.5), control, metrics={"eval_loss": 0.6})
    assert control.should_training_stop


def test_missing_metric_warns_and_does_not_stop():
    callback, args, control = EarlyStoppingCallback(1), args_for("eval_bleu"), TrainerControl()
    callback.on_train_begin(args, TrainerState(), control)
    with pytest.warns(UserWarning, match="eval_bleu"):
        callback.on_evaluate(args, TrainerState(), control, metrics={"eval_loss": 1.0})
    assert not control.should_training_stop


def test_needs_a_metric_and_evaluations():
    callback = EarlyStoppingCallback()
    with pytest.raises(ConfigError, match="metric_for_best_model"):
        callback.on_train_begin(TrainingArguments(eval_strategy="steps", eval_steps=1), TrainerState(),
                                TrainerControl())
    with pytest.raises(ConfigError, match="eval_strategy"):
        callback.on_train_begin(TrainingArguments(metric_for_best_model="loss"), TrainerState(), TrainerControl())
    with pytest.warns(UserWarning, match="load_best_model_at_end"):
        callback.on_train_begin(TrainingArguments(eval_strategy="steps", eval_steps=1, metric_for_best_model="loss"),
                                TrainerState(), TrainerControl())
    with pytest.raises(ConfigError, match="early_stopping_patience"):
        EarlyStoppingCallback(0)



def test_stops_the_run_in_process(tmp_path):
    from raytrainer import Trainer
    from raytrainer.checkpoint.listing import list_checkpoints
    from tests.models import TokenData, make_model

    # A learning rate so small that the eval loss moves by far less than the threshold: no evaluation after
    # the first improves it, so patience 2 stops the run at the third evaluation (step 6 of 20).
    args = TrainingArguments(output_dir=str(tmp_path / "out"), num_workers=0, per_device_train_batch_size=4,
                             max_steps=20, learning_rate=1e-9, optim="adamw_torch", eval_strategy="steps",
                             eval_steps=2, save_steps=2, load_best_model_at_end=True, logging_steps=2,
                             disable_tqdm=True)
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(40), eval_dataset=TokenData(8, seed=1),
                      callbacks=[EarlyStoppingCallback(early_stopping_patience=2, early_stopping_threshold=0.01)])
    output = trainer.train()
    assert output.global_step == trainer.state.global_step == 6
    assert [h["step"] for h in trainer.state.log_history if "eval_loss" in h] == [2, 4, 6]
    assert {c.step: c.committed for c in list_checkpoints(args.output_dir)} == {2: True, 4: True, 6: True}
