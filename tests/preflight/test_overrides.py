"""A Trainer subclass overriding a method of transformers' Trainer that raytrainer's loop never calls is refused
when it is built, naming the methods and the ways on; raytrainer's own hooks are not."""

from __future__ import annotations

import inspect

import pytest

from raytrainer import Seq2SeqTrainer, Trainer, TrainingArguments
from raytrainer.errors import ConfigError
from raytrainer.preflight.overrides import HF_ONLY
from tests.models import TokenData, make_model

transformers = pytest.importorskip("transformers")


def _methods(cls) -> set:
    return {name for name, value in inspect.getmembers(cls) if callable(value)}


def test_the_list_is_transformers_methods_that_raytrainers_trainer_has_not():
    """Kept true as either side changes: a method raytrainer gains (and calls) leaves the list."""
    assert HF_ONLY <= _methods(transformers.Trainer)
    assert not HF_ONLY & (_methods(Trainer) | _methods(Seq2SeqTrainer))


def test_an_override_of_a_method_our_loop_never_calls_is_refused_naming_it_and_the_ways_on():
    class CustomEval(Trainer):
        def evaluation_loop(self, *args, **kwargs):
            raise AssertionError("never called")

    class Deeper(CustomEval):
        def _save_checkpoint(self, model, trial):
            pass

    args = TrainingArguments(num_workers=0)
    with pytest.raises(ConfigError, match=r"Deeper overrides _save_checkpoint, evaluation_loop: .* never does") as err:
        Deeper(model=make_model(), args=args)
    assert "raytrainer.hosted" in str(err.value) and "compute_loss" in str(err.value)


def test_raytrainers_hooks_may_be_overridden():
    class Hooks(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

        def prediction_step(self, *args, **kwargs):
            return super().prediction_step(*args, **kwargs)

        def create_optimizer(self):
            return super().create_optimizer()

    Hooks(model=make_model(), args=TrainingArguments(num_workers=0))


def test_a_call_of_one_of_them_names_the_ways_on():
    """transformers' question-answering example: its Trainer's evaluate (ours may be overridden) calls
    self.evaluation_loop, a step of transformers' own loop."""
    class QuestionAnsweringTrainer(Trainer):
        def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix="eval"):
            return self.evaluation_loop(self.get_eval_dataloader(eval_dataset), description="Evaluation")

    trainer = QuestionAnsweringTrainer(model=make_model(), args=TrainingArguments(num_workers=0))
    with pytest.raises(AttributeError, match=r"QuestionAnsweringTrainer has no evaluation_loop: .*raytrainer launch"):
        trainer.evaluate(TokenData(4))
    assert not hasattr(trainer, "_save_checkpoint") and getattr(trainer, "num_examples", None) is None
    with pytest.raises(AttributeError, match="'QuestionAnsweringTrainer' object has no attribute 'no_such_thing'"):
        _ = trainer.no_such_thing
