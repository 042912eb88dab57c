"""A Trainer subclass overriding a method of transformers' Trainer that raytrainer's loop never calls is refused
when it is built, naming the methods and the ways on; raytrainer's own hooks are not."""

from __future__ import annotations

import inspect

import pytest

from raytrainer import Seq2SeqTrainer, Trainer, TrainingArguments
from raytrainer.errors import ConfigError
from raytrainer.preflight.overrides import HF_ONLY
from tests.models import make_model

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
