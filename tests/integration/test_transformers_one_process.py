"""In this process (num_workers=0), what a transformers user compares first: the same script under
transformers' Trainer and ours logs the same values and ends with the same weights and buffers, with the models'
default dropout on (the random stream drawn alike: the DataLoader's per-epoch draw, no draw by the 2-sample
check), a BatchNorm model's running statistics, an epoch that ends in a short batch (`epoch` counted in batches),
a model_init that reseeds (the data order follows its seed), and the printed `log_metrics` block. No Ray."""

from __future__ import annotations

import math

import pytest
import torch

from raytrainer import Trainer, TrainingArguments
from raytrainer.data.collator import DefaultCollator
from tests.hf_models import tiny_model, tiny_rows
from tests.models import weights
from tests.preflight.test_loss import WithBatchNorm

transformers = pytest.importorskip("transformers")

LOGGED = ("loss", "grad_norm", "learning_rate", "epoch")
ROWS = 27  # 4 batches of 8, the last of 3: 5 steps cross an epoch boundary


def run(trainer_class, args_class, tmp_path, make_model, model_init=False, family="bert_classifier",
        eval_rows=False, **extra) -> dict:
    common = dict(output_dir=str(tmp_path / trainer_class.__module__.split(".")[0]), per_device_train_batch_size=8,
                  max_steps=5, learning_rate=1e-3, logging_steps=1, save_strategy="no", report_to="none",
                  disable_tqdm=True, seed=0, **extra)
    if args_class is TrainingArguments:
        args = args_class(num_workers=0, **common)
    else:
        args = args_class(use_cpu=True, **common)
    rows = tiny_rows(family, n=ROWS)
    model_args = {"model_init": make_model} if model_init else {"model": make_model()}
    evals = {"all": rows, "head": tiny_rows(family, n=7)} if eval_rows == "dict" else rows if eval_rows else None
    trainer = trainer_class(args=args, train_dataset=rows, data_collator=DefaultCollator(), eval_dataset=evals,
                            **model_args)
    trainer.train()
    evaluation = trainer.evaluate(rows)
    return {"logs": [{k: h[k] for k in LOGGED if k in h} for h in trainer.state.log_history if "loss" in h],
            "weights": weights(trainer.model), "evaluation": evaluation, "trainer": trainer,
            "evaluations": [(h["step"], h["eval_loss"]) for h in trainer.state.log_history if "eval_loss" in h],
            "records": [h for h in trainer.state.log_history if "loss" not in h]}


def both(tmp_path, make_model, **kwargs):
    ours = run(Trainer, TrainingArguments, tmp_path, make_model, **kwargs)
    theirs = run(transformers.Trainer, transformers.TrainingArguments, tmp_path, make_model, **kwargs)
    return ours, theirs


def assert_same(ours: dict, theirs: dict, eval_loss: bool = True):
    assert len(ours["logs"]) == len(theirs["logs"]) == 5
    for mine, reference in zip(ours["logs"], theirs["logs"]):
        assert mine.keys() == reference.keys()
        for key in reference:
            assert math.isclose(mine[key], reference[key], rel_tol=1e-6, abs_tol=1e-9), (key, mine, reference)
    assert ours["weights"].keys() == theirs["weights"].keys()
    for name, tensor in theirs["weights"].items():
        assert torch.allclose(ours["weights"][name].float(), tensor.float(), rtol=1e-6, atol=1e-7), name
    # evaluate() returns (and logs) the epoch, as transformers' log() adds it to the caller's dict
    assert ours["evaluation"]["epoch"] == theirs["evaluation"]["epoch"] == 1.25  # 4 batches an epoch, 5 steps
    if eval_loss:  # (token losses: ours is the mean over the set's label items, theirs per batch: docs/numbers.md)
        assert ours["evaluation"]["eval_loss"] == pytest.approx(theirs["evaluation"]["eval_loss"], rel=1e-6)


def test_bert_with_its_default_dropout_equals_transformers(tmp_path):
    assert_same(*both(tmp_path, lambda: tiny_model("bert_classifier", dropout=0.1)))


def test_batchnorm_running_statistics_equal_transformers(tmp_path):
    ours, theirs = both(tmp_path, lambda: (torch.manual_seed(0), WithBatchNorm())[1], family="llama")
    assert_same(ours, theirs, eval_loss=False)
    assert int(ours["weights"]["norm.num_batches_tracked"]) == 5  # one per step: the check added none


def test_a_model_init_that_reseeds_sets_the_data_order_as_in_transformers(tmp_path):
    def reseeding():
        torch.manual_seed(7)  # transformers' sampler is seeded after model_init: its seed is this one
        return tiny_model("bert_classifier", seed=7)

    assert_same(*both(tmp_path, reseeding, model_init=True))


def test_the_last_step_evaluates_off_the_interval_as_in_transformers(tmp_path):
    """transformers 5 evaluates at the run's last step when eval_steps does not divide it (5 steps, every 2)."""
    ours, theirs = both(tmp_path, lambda: tiny_model("bert_classifier"), eval_rows=True, eval_strategy="steps",
                        eval_steps=2)
    assert_same(ours, theirs)
    assert [step for step, _ in ours["evaluations"]] == [step for step, _ in theirs["evaluations"]] == [2, 4, 5, 5]
    for (_, mine), (_, reference) in zip(ours["evaluations"], theirs["evaluations"]):
        assert mine == pytest.approx(reference, rel=1e-6)


def test_a_dict_of_eval_datasets_is_logged_and_reported_per_dataset_as_in_transformers(tmp_path):
    """transformers evaluates a dict of eval datasets one evaluate() each: a log_history record and an
    on_evaluate per dataset, during training and in evaluate()."""
    class Seen(transformers.TrainerCallback):
        def __init__(self):
            self.metrics = []

        def on_evaluate(self, args, state, control, metrics=None, **kwargs):
            self.metrics.append(sorted(k for k in metrics if not k.endswith(("runtime", "per_second"))))

    runs = {}
    for name, (trainer_class, args_class) in {"ours": (Trainer, TrainingArguments), "theirs": (
            transformers.Trainer, transformers.TrainingArguments)}.items():
        seen = Seen()
        common = dict(output_dir=str(tmp_path / name), per_device_train_batch_size=8, max_steps=4, eval_steps=2,
                      eval_strategy="steps", learning_rate=1e-3, logging_steps=1, save_strategy="no",
                      report_to="none", disable_tqdm=True, seed=0)
        args = args_class(num_workers=0, **common) if args_class is TrainingArguments else args_class(
            use_cpu=True, **common)
        rows = tiny_rows("bert_classifier", n=ROWS)
        trainer = trainer_class(model=tiny_model("bert_classifier"), args=args, train_dataset=rows,
                                eval_dataset={"all": rows, "head": tiny_rows("bert_classifier", n=7)},
                                data_collator=DefaultCollator(), callbacks=[seen])
        trainer.train()
        returned = trainer.evaluate()
        records = [h for h in trainer.state.log_history if "loss" not in h and "train_loss" not in h]
        runs[name] = (records, seen.metrics, returned)
    (ours, our_calls, our_metrics), (theirs, their_calls, their_metrics) = runs["ours"], runs["theirs"]
    assert [(h["step"], sorted(k for k in h if "eval_" in k and not k.endswith(("runtime", "per_second"))))
            for h in ours] == [(h["step"], sorted(k for k in h if "eval_" in k and not k.endswith((
                "runtime", "per_second")))) for h in theirs]
    assert [h["step"] for h in ours] == [2, 2, 4, 4, 4, 4]
    assert our_calls == their_calls and len(our_calls) == 6
    for mine, reference in zip(ours, theirs):
        for key in ("eval_all_loss", "eval_head_loss"):
            if key in reference:
                assert mine[key] == pytest.approx(reference[key], rel=1e-6)
    assert {k for k in our_metrics if "eval_" in k} == {k for k in their_metrics if "eval_" in k}


def test_predict_with_prediction_loss_only_returns_the_loss_alone_as_transformers(tmp_path):
    ours, theirs = both(tmp_path, lambda: tiny_model("bert_classifier"), prediction_loss_only=True)
    rows = tiny_rows("bert_classifier", n=11)
    mine, reference = ours["trainer"].predict(rows), theirs["trainer"].predict(rows)
    assert (mine.predictions, mine.label_ids, reference.predictions, reference.label_ids) == (None,) * 4
    assert mine.metrics["test_loss"] == pytest.approx(reference.metrics["test_loss"], rel=1e-6)


def test_gradient_checkpointing_stays_on_the_trained_model_and_log_metrics_prints_alike(tmp_path, capsys):
    ours = run(Trainer, TrainingArguments, tmp_path, lambda: tiny_model("bert_classifier"),
               gradient_checkpointing=True)
    assert ours["trainer"].model.is_gradient_checkpointing  # as transformers' train() leaves it
    metrics = {"train_runtime": 16.19, "total_flos": 1.288e9, "train_loss": 1.0987654321, "epoch": 1.25,
               "train_samples_per_second": 123.456789, "train_steps_per_second": 7}
    capsys.readouterr()
    ours["trainer"].log_metrics("train", metrics)
    printed = capsys.readouterr().out
    from transformers.trainer_pt_utils import log_metrics

    log_metrics(ours["trainer"], "train", metrics)  # transformers' own function, on our trainer
    assert printed == capsys.readouterr().out
    assert "train_runtime            = 0:00:16.19" in printed and "total_flos               =        1GF" in printed


SEEN: list = []  # what Recorder was given: a module's list, as the trainer's copy of a Recorder records here too


def _tensor(value):
    if isinstance(value, dict):  # batch_eval_metrics: transformers passes the step's batch as the inputs
        value = value["input_ids"]
    return None if value is None else torch.as_tensor(value).clone()


class Recorder:
    """A compute_metrics that keeps what it was given (include_for_metrics' inputs and losses)."""

    def __call__(self, prediction, compute_result=None):
        SEEN.append({"inputs": _tensor(prediction.inputs), "losses": _tensor(prediction.losses),
                     "labels": _tensor(prediction.label_ids)})
        return {"calls": len(SEEN)}


@pytest.mark.parametrize("batched", [False, True], ids=["whole_set", "batch_eval_metrics"])
def test_include_for_metrics_gives_compute_metrics_the_inputs_and_losses_of_transformers(tmp_path, batched):
    rows = tiny_rows("bert_classifier", n=11)  # 3 batches of 4, 4 and 3 rows, each padded to its own length
    seen = {}
    for name, trainer_class, args_class, extra in (("ours", Trainer, TrainingArguments, {"num_workers": 0}),
                                                   ("theirs", transformers.Trainer, transformers.TrainingArguments,
                                                    {"use_cpu": True})):
        args = args_class(output_dir=str(tmp_path / name), per_device_eval_batch_size=4, report_to="none",
                          include_for_metrics=["inputs", "loss"], batch_eval_metrics=batched, **extra)
        trainer = trainer_class(model=tiny_model("bert_classifier"), args=args, data_collator=DefaultCollator(),
                                compute_metrics=Recorder())
        SEEN.clear()
        trainer.evaluate(rows)
        seen[name] = list(SEEN)
    assert len(seen["ours"]) == len(seen["theirs"]) == (3 if batched else 1)
    for mine, reference in zip(seen["ours"], seen["theirs"]):
        assert torch.equal(mine["inputs"], reference["inputs"]) and torch.equal(mine["labels"], reference["labels"])
        assert mine["losses"].shape == reference["losses"].shape
        assert torch.allclose(mine["losses"].float(), reference["losses"].float(), rtol=1e-6)
    if not batched:  # the whole set: padded with -100 across batches, as transformers' nested_concat
        assert seen["ours"][0]["inputs"].shape[0] == 11 and (seen["ours"][0]["inputs"] == -100).any()
