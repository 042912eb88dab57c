"""A call's datasets and the arguments that need them, checked on the driver before any actor starts
(raytrainer/preflight/inputs.py). The other refusals: tests/preflight/test_refusals.py."""

import pytest

from raytrainer import ConfigError, Trainer
from tests.models import TokenData, make_model
from tests.preflight.test_refusals import args


def test_eval_strategy_without_eval_dataset(tmp_path):
    trainer = Trainer(model=make_model(), args=args(tmp_path, eval_strategy="steps", eval_steps=1),
                      train_dataset=TokenData(8))
    with pytest.raises(ConfigError, match="eval_strategy='steps' needs an eval_dataset"):
        trainer.train()


class NotADataset:  # neither map-style nor iterable (iterable datasets: tests/data/test_streaming.py)
    pass


@pytest.mark.parametrize("dataset,message", [(NotADataset(), "map-style dataset"), (TokenData(0), "is empty")])
def test_datasets_that_cannot_be_sharded(tmp_path, dataset, message):
    trainer = Trainer(model=make_model(), args=args(tmp_path), train_dataset=dataset)
    with pytest.raises(ConfigError, match=f"train_dataset .*{message}|train_dataset {message}"):
        trainer.train()
