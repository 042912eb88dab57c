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


def test_drop_last_on_fewer_rows_than_one_global_micro_batch_is_refused_naming_the_numbers(tmp_path):
    """5 rows, 4 per worker on 2 workers, drop_last: no batch at all (it trained 0 steps and said nothing). 8
    rows fill one global micro-batch; without drop_last the 5 rows train; an own get_train_dataloader decides."""
    def trainer(rows, trainer_class=Trainer, **extra):
        return trainer_class(model=make_model(), args=args(tmp_path, per_device_train_batch_size=4, max_steps=1,
                                                           **{"dataloader_drop_last": True, **extra}),
                             train_dataset=TokenData(rows))

    from raytrainer.preflight.inputs import check_train_inputs

    wide = {"num_workers": 2}
    with pytest.raises(ConfigError, match=r"5 rows, fewer than .* \(4 x 2 worker\(s\) = 8\).*drop_last"):
        check_train_inputs(trainer(5, **wide))
    check_train_inputs(trainer(8, **wide))
    check_train_inputs(trainer(5, dataloader_drop_last=False, **wide))

    class OwnLoader(Trainer):
        def get_train_dataloader(self):
            return super().get_train_dataloader()

    check_train_inputs(trainer(5, OwnLoader, **wide))
    with pytest.raises(ConfigError, match=r"\(4 x 1 worker\(s\) = 4\)"):
        trainer(3).train()  # in this process (the suite's args: num_workers=0)
