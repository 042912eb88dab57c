"""The examples train: each runs in process (`--num_workers 0`, few steps) through its own `main(argv)`.

The 2-worker path of an example is exercised by tests/integration/deploy/test_job_submit.py (a real `ray job submit`).
"""

from __future__ import annotations

import pytest
import torch

from raytrainer.checkpoint.listing import list_checkpoints
from tests.hf_models import tiny_model

FAST = ["--num_workers", "0", "--disable_tqdm", "--logging_steps", "10"]


def _losses(log_history):
    return [entry["loss"] for entry in log_history if "loss" in entry]


def test_sequence_classification_learns_beyond_chance(tmp_path):
    from examples.sequence_classification import main

    out = main([*FAST, "--output_dir", str(tmp_path), "--max_steps", "120", "--eval_steps", "60",
                "--save_steps", "60"])
    losses = _losses(out["log_history"])
    accuracy = [e["eval_accuracy"] for e in out["log_history"] if "eval_accuracy" in e]
    assert len(losses) >= 4 and losses[-1] < losses[0] * 0.9, losses
    assert len(accuracy) == 2 and accuracy[-1] > 0.5, accuracy  # 4 classes: chance is 0.25
    assert [c.step for c in list_checkpoints(str(tmp_path)) if c.committed] == [60, 120]


def test_custom_loss_is_the_class_weighted_cross_entropy():
    """The subclass's old-signature compute_loss, called as HF calls it, gives the weighted loss."""

    from examples.custom_loss import NUM_LABELS, CustomTrainer, LossArguments, WeightedClasses
    from raytrainer import TrainingArguments

    model = tiny_model("bert_classifier", vocab_size=48, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=16, max_position_embeddings=24, num_labels=NUM_LABELS,
                       hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    trainer = CustomTrainer(model=model, args=TrainingArguments(num_workers=0))
    trainer.class_weights = [1.0, 2.0, 3.0]
    data = WeightedClasses(16, LossArguments(), seed=0)
    batch = {"input_ids": torch.stack([data[i]["input_ids"] for i in range(16)]),
             "labels": torch.tensor([data[i]["labels"] for i in range(16)])}
    loss, outputs = trainer.compute_loss(model, dict(batch), return_outputs=True)
    weights = torch.tensor([1.0, 2.0, 3.0])[batch["labels"]]
    per_sample = torch.nn.functional.cross_entropy(outputs.logits, batch["labels"], reduction="none")
    torch.testing.assert_close(loss, (per_sample * weights).sum() / weights.sum())
    assert not torch.allclose(loss, per_sample.mean())  # the weights matter on this batch


def test_custom_loss_example_trains(tmp_path):
    from examples.custom_loss import main

    out = main([*FAST, "--output_dir", str(tmp_path), "--max_steps", "60", "--eval_steps", "60",
                "--save_steps", "60"])
    losses = _losses(out["log_history"])
    assert len(losses) >= 4 and losses[-1] < losses[0] * 0.9, losses
    final = [e for e in out["log_history"] if "eval_accuracy" in e][-1]
    assert {"eval_recall_0", "eval_recall_1", "eval_recall_2"} <= final.keys()


@pytest.mark.usefixtures("ray_session")
def test_ray_data_example_learns_from_its_map_batches_pipeline(tmp_path):
    from examples.ray_data_lm import main

    out = main([*FAST, "--output_dir", str(tmp_path), "--max_steps", "40", "--eval_steps", "40",
                "--save_steps", "40"])
    losses = _losses(out["log_history"])
    assert len(losses) == 4 and losses[-1] < losses[0] * 0.8, losses
    assert [e["eval_loss"] for e in out["log_history"] if "eval_loss" in e][-1] < 4.0  # uniform bytes: 5.5
    assert [c.step for c in list_checkpoints(str(tmp_path)) if c.committed] == [40]


@pytest.mark.parametrize("module", ["quickstart", "sequence_classification", "custom_loss", "ray_data_lm"])
def test_examples_take_arguments_from_a_yaml_file_and_the_command_line(module, tmp_path):
    import importlib

    parser = importlib.import_module(f"examples.{module}").build_parser()
    config = tmp_path / "args.yaml"
    config.write_text("num_workers: 3\nlearning_rate: 1.0e-4\nseed: 7\n")
    *_, args = parser.parse_args_into_dataclasses([str(config), "--seed", "8"])
    assert (args.num_workers, args.learning_rate, args.seed) == (3, 1e-4, 8)


def test_hyperparameter_search_example_runs_each_trial_in_its_folder_and_returns_the_best(tmp_path):
    """The Optuna backend, in process: two trials (sampled at random: their accuracies are not checked against
    chance), each a run in its own folder with its checkpoints; the best is the study's."""
    pytest.importorskip("optuna")
    from examples.hyperparameter_search import main

    best = main([*FAST, "--backend", "optuna", "--n_trials", "2", "--output_dir", str(tmp_path), "--max_steps",
                 "60", "--eval_steps", "30", "--save_steps", "30"])
    study = best.run_summary
    assert len(study.trials) == 2 and best.objective == study.best_value and 0.0 <= best.objective <= 1.0
    assert set(best.hyperparameters) == {"learning_rate", "weight_decay"}
    for trial in study.trials:
        assert [c.step for c in list_checkpoints(str(tmp_path / f"run-{trial.number}")) if c.committed] == [30, 60]
