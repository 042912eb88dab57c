"""report_to: HF's values ("none", "all", a name, a list), a registry for your own reporter, and errors that
name the value, the choices and the pip extra, raised when TrainingArguments is built."""

import importlib.util
import re

import pytest

from raytrainer import ArgumentParser, ConfigError, Trainer, TrainerCallback, TrainingArguments, register_reporter
from raytrainer.arguments import report_to
from tests.models import make_model


@pytest.fixture(autouse=True)
def clean_registry(monkeypatch):
    monkeypatch.setattr(report_to, "REGISTERED", {})


def names(trainer):
    return [type(c).__name__ for c in trainer.callback_handler.callbacks]


@pytest.mark.parametrize("value, expected", [
    ("none", []), (None, []), (["none"], []), ("tensorboard", ["tensorboard"]),
    (["mlflow", "tensorboard", "mlflow"], ["mlflow", "tensorboard"]),
])
def test_values_normalise_to_a_list(value, expected):
    assert TrainingArguments(report_to=value).report_to == expected


def test_default_is_none_as_in_transformers():
    transformers = pytest.importorskip("transformers")
    assert TrainingArguments().report_to == transformers.TrainingArguments(output_dir="x").report_to == []


def test_all_means_the_installed_reporters(monkeypatch):
    # dev installs all four
    assert TrainingArguments(report_to="all").report_to == ["mlflow", "tensorboard", "trackio", "wandb"]
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "mlflow" else real_find_spec(name, *a))
    assert TrainingArguments(report_to="all").report_to == ["tensorboard", "trackio", "wandb"]


def test_trainer_adds_one_callback_per_reporter(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), report_to=["tensorboard", "mlflow"])
    assert names(Trainer(model=make_model(), args=args))[1:] == ["TensorBoardCallback", "MLflowCallback"]
    assert names(Trainer(model=make_model(), args=TrainingArguments(output_dir=str(tmp_path)))) == [
        "ProgressCallback"]


def test_unknown_name_lists_the_choices_and_how_to_add_one():
    message = ("report_to='comet_ml': 'comet_ml' is not a reporter; choose from none, all, mlflow, tensorboard, "
               "trackio, wandb. To add "
               "your own, call raytrainer.register_reporter(name, cls) first, or pass the callback in "
               "Trainer(callbacks=[...]).")
    with pytest.raises(ConfigError, match=re.escape(message)):
        TrainingArguments(report_to="comet_ml")
    with pytest.raises(ConfigError, match="cannot be combined"):
        TrainingArguments(report_to=["all", "mlflow"])


@pytest.mark.parametrize("name, package", [("mlflow", "mlflow"), ("tensorboard", "tensorboard")])
def test_missing_package_names_the_extra(monkeypatch, name, package):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda n, *a: None if n == package else real_find_spec(n, *a))
    with pytest.raises(ConfigError, match=re.escape(
            f"report_to={name!r} needs the {package!r} package, which is not installed: "
            f'pip install "raytrainer[{name}]".')):
        TrainingArguments(report_to=name)


def test_register_a_reporter(tmp_path):
    class JsonLines(TrainerCallback):
        pass

    register_reporter("jsonl", JsonLines)
    args = TrainingArguments(output_dir=str(tmp_path), report_to=["jsonl"])
    assert names(Trainer(model=make_model(), args=args)) == ["ProgressCallback", "JsonLines"]
    assert "jsonl" in TrainingArguments(report_to="all").report_to
    with pytest.raises(ConfigError, match="reserved"):
        register_reporter("all", JsonLines)


def test_command_line_and_logging_dir(tmp_path, monkeypatch):
    (args,) = ArgumentParser(TrainingArguments).parse_args_into_dataclasses(
        ["--output_dir", str(tmp_path), "--report_to", "tensorboard", "mlflow", "--optim_args", "momentum=0.9",
         "--optim", "sgd"])
    assert args.report_to == ["tensorboard", "mlflow"] and args.optim_args == "momentum=0.9"
    assert args.logging_dir.startswith(str(tmp_path / "runs") + "/")  # HF's default: output_dir/runs/<time>_<host>
    monkeypatch.setenv("TENSORBOARD_LOGGING_DIR", str(tmp_path / "env"))  # HF 5's way to choose it
    assert TrainingArguments(output_dir=str(tmp_path)).logging_dir == str(tmp_path / "env")
    assert TrainingArguments(logging_dir="s3://b/tb").logging_dir == "s3://b/tb"  # an explicit value wins
