"""The training loop in the driver process (num_workers=0): exact loss normalisation, accumulation,
logging, evaluation, and the HF-shaped outputs."""

import math

import numpy as np
import pytest
import torch

from raytrainer import Trainer, TrainerCallback, TrainingArguments
from tests.models import TokenData, assert_same_weights, make_model, weights


def run(tmp_path, n=40, **overrides):
    args = dict(output_dir=str(tmp_path / "out"), num_workers=0, per_device_train_batch_size=8, max_steps=6,
                learning_rate=1e-2, optim="adamw_torch", logging_steps=1, save_strategy="no", disable_tqdm=True)
    args.update(overrides)
    model = make_model()
    trainer = Trainer(model=model, args=TrainingArguments(**args), train_dataset=TokenData(n))
    output = trainer.train()
    return trainer, output


def test_gradient_accumulation_equals_one_big_batch_on_padded_variable_length_labels(tmp_path):
    big, big_out = run(tmp_path / "a", per_device_train_batch_size=8)
    acc, acc_out = run(tmp_path / "b", per_device_train_batch_size=2, gradient_accumulation_steps=4)
    big_losses = [h["loss"] for h in big.state.log_history if "loss" in h]
    acc_losses = [h["loss"] for h in acc.state.log_history if "loss" in h]
    assert len(big_losses) == 6
    np.testing.assert_allclose(acc_losses, big_losses, rtol=1e-5)
    assert_same_weights(weights(acc.model), weights(big.model))
    assert acc_out.global_step == big_out.global_step == 6


def test_loss_is_mean_over_label_tokens_of_the_global_batch(tmp_path):
    """Step 1's logged loss equals a direct computation over the first global batch (token mean)."""
    trainer, _ = run(tmp_path, max_steps=1, per_device_train_batch_size=4, gradient_accumulation_steps=2)
    from raytrainer.data.collator import DefaultCollator
    from raytrainer.data.sampler import DistributedBatchSampler

    data = TokenData(40)
    first = next(iter(DistributedBatchSampler(40, 8, seed=42)))
    batch = DefaultCollator()([data[i] for i in first])
    model = make_model()
    logits = model(batch["input_ids"])["logits"]
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["labels"].flatten(),
                                                 ignore_index=-100).item()
    assert trainer.state.log_history[0]["loss"] == pytest.approx(expected, rel=1e-5)


def test_logs_and_train_output_are_hf_shaped(tmp_path):
    seen = []

    class Record(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            seen.append(dict(logs))

    args = TrainingArguments(output_dir=str(tmp_path), num_workers=0, per_device_train_batch_size=8,
                             num_train_epochs=1.5, logging_steps=2, learning_rate=1e-2, warmup_steps=0.25,
                             save_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(40), callbacks=[Record])
    output = trainer.train()
    assert output.global_step == math.ceil(1.5 * 5) == trainer.state.global_step
    assert seen and {"loss", "grad_norm", "learning_rate", "epoch", "step", "train_samples_per_second",
                     "train_tokens_per_second"} <= seen[0].keys()
    assert seen[0]["step"] == 2
    losses = [record for record in seen if "loss" in record]
    assert losses[-1]["loss"] < losses[0]["loss"]
    assert "train_runtime" in seen[-1]  # as in HF, the run's metrics are logged last (on_log)
    assert {"train_runtime", "train_loss", "train_samples_per_second"} <= output.metrics.keys()
    assert trainer.state.log_history[-1]["train_loss"] == output.training_loss


def test_evaluate_and_predict_in_process(tmp_path):
    def metrics(p):
        preds = p.predictions.argmax(-1)
        mask = p.label_ids != -100
        return {"accuracy": float((preds[mask] == p.label_ids[mask]).mean())}

    args = TrainingArguments(output_dir=str(tmp_path), num_workers=0, per_device_eval_batch_size=4,
                             disable_tqdm=True)
    trainer = Trainer(model=make_model(), args=args, eval_dataset=TokenData(11, seed=1), compute_metrics=metrics)
    result = trainer.evaluate()
    assert {"eval_loss", "eval_accuracy", "eval_runtime"} <= result.keys()
    # Before any training, as transformers 5's log() adds it (its state's epoch starts at 0): returned and logged.
    assert result["epoch"] == 0 and trainer.state.log_history[-1]["epoch"] == 0
    prediction = trainer.predict(TokenData(7, seed=2))
    assert prediction.predictions.shape[:2] == (7, 8) and prediction.label_ids.shape == (7, 8)
    assert "test_loss" in prediction.metrics


def test_model_init_and_optimizers_from_the_user(tmp_path):
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    args = TrainingArguments(output_dir=str(tmp_path), num_workers=0, max_steps=3, save_strategy="no",
                             disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=TokenData(24), optimizers=(optimizer, scheduler))
    trainer.train()
    assert trainer.state.log_history[-1]["train_loss"] > 0
    trainer2 = Trainer(model_init=make_model, args=args, train_dataset=TokenData(24))
    trainer2.train()
    assert isinstance(trainer2.model, torch.nn.Module)
    assert not torch.equal(trainer2.model.head.weight, make_model().head.weight)


def test_hf_datasets_dataset_with_label_column_and_unused_text_column(tmp_path):
    import datasets

    g = torch.Generator().manual_seed(0)
    features = torch.randn(30, 4, generator=g)
    table = datasets.Dataset.from_dict({"x": features.tolist(), "label": (features.sum(1) > 0).long().tolist(),
                                        "text": [f"row {i}" for i in range(30)]})

    class Classifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 2)

        def forward(self, x, labels=None):
            logits = self.linear(x)
            return {"loss": torch.nn.functional.cross_entropy(logits, labels), "logits": logits}

    args = TrainingArguments(output_dir=str(tmp_path), num_workers=0, max_steps=20, learning_rate=0.1,
                             per_device_train_batch_size=10, save_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=Classifier(), args=args, train_dataset=table, eval_dataset=table,
                      compute_metrics=lambda p: {"acc": float((p.predictions.argmax(-1) == p.label_ids).mean())})
    before = trainer.evaluate()["eval_acc"]
    trainer.train()
    assert trainer.evaluate()["eval_acc"] > max(before, 0.8)


def test_several_eval_datasets_during_training_get_their_own_prefixes(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), num_workers=0, max_steps=4, eval_strategy="steps",
                             eval_steps=2, save_strategy="no", disable_tqdm=True)
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(24),
                      eval_dataset={"short": TokenData(5, seed=1), "long": TokenData(9, seed=2)})
    trainer.train()
    evals = [h for h in trainer.state.log_history if any(k.startswith("eval_") for k in h)]
    assert [h["step"] for h in evals] == [2, 2, 4, 4]  # a record per dataset, as transformers logs them
    assert "eval_short_loss" in evals[0] and "eval_long_loss" in evals[1]
    assert {"eval_short_loss", "eval_long_loss"} <= trainer.evaluate().keys()


def test_transformers_optimizer_helpers_answer_as_transformers_does(tmp_path):
    """get_decay_parameter_names, get_num_trainable_parameters, metrics_format as transformers' Trainer gives them;
    get_learning_rates and get_optimizer_group from a hook on the worker, where the optimizer is; on the driver
    before training, a ValueError naming where to call them."""
    transformers = pytest.importorskip("transformers")
    import json

    record = tmp_path / "seen.json"  # the worker's trainer is a copy of this one: it writes what it sees

    class Probing(Trainer):
        def training_step(self, model, inputs, num_items_in_batch=None):
            if not record.exists():
                first = next(model.parameters())
                record.write_text(json.dumps({"rates": self.get_learning_rates(),
                                              "group_of_first": self.get_optimizer_group(first)["weight_decay"],
                                              "groups": [len(g) for g in self.get_optimizer_group()]}))
            return super().training_step(model, inputs, num_items_in_batch)

    model = make_model()
    theirs = transformers.Trainer(model=model, args=transformers.TrainingArguments(str(tmp_path / "hf"), use_cpu=True,
                                                                                   report_to="none"))
    args = TrainingArguments(output_dir=str(tmp_path), num_workers=0, max_steps=1, learning_rate=0.25,
                             weight_decay=0.1, save_strategy="no", disable_tqdm=True)
    ours = Probing(model=model, args=args, train_dataset=TokenData(8))
    assert ours.get_decay_parameter_names(model) == theirs.get_decay_parameter_names(model)
    assert ours.get_num_trainable_parameters() == theirs.get_num_trainable_parameters()
    metrics = {"train_runtime": 3725.5, "total_flos": 3.5e10, "train_loss": 1.234567, "epoch": 1}
    # (transformers' own Trainer.metrics_format is its module function set on the class: called on an instance
    # it gets the Trainer as its metrics; the function is the reference)
    assert ours.metrics_format(metrics) == transformers.trainer_pt_utils.metrics_format(metrics)
    with pytest.raises(ValueError, match="built on each worker"):
        ours.get_learning_rates()
    ours.train()
    seen = json.loads(record.read_text())
    decayed = len(theirs.get_decay_parameter_names(model))
    assert seen == {"rates": [0.25, 0.25], "group_of_first": seen["group_of_first"],
                    "groups": [decayed, sum(1 for _ in model.parameters()) - decayed]}
    first_name = next(name for name, _ in model.named_parameters())
    assert seen["group_of_first"] == (0.1 if first_name in theirs.get_decay_parameter_names(model) else 0.0)
