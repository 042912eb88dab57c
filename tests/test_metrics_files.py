"""The end-of-script helpers of HF example scripts (raytrainer/metrics_files.py): log_metrics, save_metrics and
save_state work unchanged on local disk and S3, and the printed block formats values as transformers' does."""

import json

import pytest

from raytrainer import Trainer, TrainingArguments
from raytrainer.checkpoint.model_io import load_model_state
from raytrainer.metrics_files import metrics_format
from tests.models import TokenData, assert_same_weights, make_model, weights

transformers = pytest.importorskip("transformers")


def test_metrics_are_formatted_as_transformers_formats_them():
    from transformers.trainer_pt_utils import metrics_format as hf_metrics_format

    metrics = {"train_runtime": 3723.456, "eval_runtime": 0.5, "train_mem_cpu_alloc_delta": 5 << 20,
               "train_mem_gpu_peaked_delta": (3 << 20) + 7, "total_flos": 3 << 30, "train_loss": 1.234567,
               "epoch": 2, "train_samples_per_second": 12.3456789, "note": "text", "flag": True}
    assert metrics_format(metrics) == hf_metrics_format(dict(metrics))
    assert metrics_format(metrics)["train_runtime"] == "1:02:03.45" and metrics_format(metrics)["total_flos"] == "3GF"


def test_hf_example_script_ending_log_save_metrics_and_state(output_url, tmp_path, capsys):
    """The last lines of a Hugging Face example script work unchanged, on local disk and S3."""
    output_dir, opts = output_url
    args = TrainingArguments(output_dir=output_dir, storage_options=opts, num_workers=0, max_steps=2,
                             save_strategy="no", logging_steps=1, disable_tqdm=True)
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(16), eval_dataset=TokenData(5))
    result = trainer.train()
    trainer.save_model()
    trainer.log_metrics("train", result.metrics)
    trainer.save_metrics("train", result.metrics)
    eval_metrics = trainer.evaluate()
    trainer.save_metrics("eval", eval_metrics)
    trainer.save_state()
    assert "***** train metrics *****" in capsys.readouterr().out
    from raytrainer.storage import join, read_text

    assert json.loads(read_text(join(output_dir, "train_results.json"), opts))["train_loss"] == result.training_loss
    combined = json.loads(read_text(join(output_dir, "all_results.json"), opts))
    assert {"train_loss", "eval_loss"} <= combined.keys()
    state_file = tmp_path / "state.json"
    state_file.write_text(read_text(join(output_dir, "trainer_state.json"), opts))
    assert transformers.TrainerState.load_from_json(str(state_file)).global_step == 2
    assert_same_weights(load_model_state(output_dir, opts), weights(trainer.model))
