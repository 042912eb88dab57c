"""A run_summarization-shaped script by the import, on 2 workers: its generated ids, labels and metrics equal those
of transformers' Seq2SeqTrainer in one process, for an evaluation inside train() (generation_max_length),
evaluate(num_beams=, max_length=) and predict(max_length=, **gen_kwargs) (tests/seq2seq/summarization.py is the script).

The losses are not compared: raytrainer's eval loss is the mean over every label token of the set, transformers'
the mean of its batches' means (docs/design.md, "The loss")."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from tests.seq2seq import summarization

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("ray_session")

METRICS = ("overlap", "gen_len", "ordered_chars")


def run_script(package: str, output_dir: str, eval_batch: int = 2, **placement) -> dict:
    """The script, with Seq2SeqTrainer and Seq2SeqTrainingArguments imported from `package`."""
    module = importlib.import_module(package)
    tok = summarization.tokenizer()
    rows = summarization.dataset(tok)
    # learning_rate=0: the step changes no weight, so the evaluation inside train() generates from the same model
    args = module.Seq2SeqTrainingArguments(
        output_dir=output_dir, predict_with_generate=True, generation_max_length=30, per_device_train_batch_size=4,
        per_device_eval_batch_size=eval_batch, max_steps=1, learning_rate=0.0, eval_strategy="steps", eval_steps=1,
        save_strategy="no", report_to="none", disable_tqdm=True, seed=0, **placement)
    trainer = module.Seq2SeqTrainer(model=summarization.model(), args=args, train_dataset=rows, eval_dataset=rows,
                                    processing_class=tok, data_collator=transformers.DataCollatorForSeq2Seq(tok),
                                    compute_metrics=summarization.metrics_for(tok))
    trainer.train()
    in_train = next(h for h in trainer.state.log_history if "eval_gen_len" in h)
    evaluated = trainer.evaluate(num_beams=2, max_length=25)
    predicted = trainer.predict(rows, max_length=30, eos_token_id=[1, 17, 29])  # a generate kwarg passed through
    return {"in_train": _ours(in_train, "eval"), "evaluate": _ours(evaluated, "eval"),
            "predictions": predicted.predictions, "label_ids": predicted.label_ids,
            "predict": _ours(predicted.metrics, "test")}


def _ours(metrics: dict, prefix: str) -> dict:
    return {k: metrics[f"{prefix}_{k}"] for k in METRICS}


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict:
    return run_script("transformers", str(tmp_path_factory.mktemp("hf")), use_cpu=True)


def test_two_workers_generate_what_transformers_generates_in_one_process(tmp_path, reference):
    ours = run_script("raytrainer", str(tmp_path / "rt"), num_workers=2)

    for key in ("in_train", "evaluate", "predict"):
        assert ours[key] == pytest.approx(reference[key], rel=1e-9), key
    np.testing.assert_array_equal(ours["predictions"], reference["predictions"])
    np.testing.assert_array_equal(ours["label_ids"], reference["label_ids"])
    predictions = reference["predictions"]
    assert predictions.dtype.kind == "i" and predictions.shape == (7, 30)
    # The last row (rank 1's one-row batch) stopped early: padded to the others' width with -100, in its place.
    assert (predictions[-1] == -100).any() and not (predictions[:-1] == -100).any()


def test_under_fsdp_the_evaluation_inside_train_generates_the_same(tmp_path, reference):
    """FSDP2: generate runs the encoder before any forward of the root module, whose own (shared embedding)
    parameters must be gathered for it; with 3 rows a batch, rank 1 has one batch to rank 0's two and joins
    rank 0's second generate with a filler (synced_gpus: every forward pass is a collective)."""
    ours = run_script("raytrainer", str(tmp_path / "rt"), eval_batch=3, num_workers=2, fsdp="full_shard auto_wrap")
    assert ours["in_train"] == pytest.approx(reference["in_train"], rel=1e-9)
