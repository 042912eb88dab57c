"""Seq2SeqTrainer in the driver process (num_workers=0, the same loop as the workers'): generation_config from a
directory, for a model given and one built by model_init, equal to transformers'; and the script's compute_metrics
given logits by the plain Trainer fails with an error that names compute_metrics and the fix."""

from __future__ import annotations

import numpy as np
import pytest

import raytrainer
from tests.seq2seq import summarization

transformers = pytest.importorskip("transformers")


def _trainer(module, tok, rows, output_dir: str, trainer_class: str = "Seq2SeqTrainer", model_init=None, **args):
    arguments = module.Seq2SeqTrainingArguments(output_dir=output_dir, per_device_eval_batch_size=2,
                                                report_to="none", disable_tqdm=True, **args)
    model = None if model_init is not None else summarization.model()
    return getattr(module, trainer_class)(model=model, model_init=model_init, args=arguments, processing_class=tok,
                                          data_collator=transformers.DataCollatorForSeq2Seq(tok),
                                          compute_metrics=summarization.metrics_for(tok))


def test_generation_config_directory_as_transformers_for_a_model_and_for_model_init(tmp_path):
    tok = summarization.tokenizer()
    rows = summarization.dataset(tok)
    transformers.GenerationConfig(max_length=12, decoder_start_token_id=0, eos_token_id=1,
                                  pad_token_id=0).save_pretrained(tmp_path / "gen")
    options = dict(predict_with_generate=True, generation_config=str(tmp_path / "gen"))
    theirs = _trainer(transformers, tok, rows, str(tmp_path / "hf"), use_cpu=True, **options).predict(rows)
    # padded to the loaded config's max_length, not the model's own (20): the config was applied
    assert theirs.predictions.shape == (7, 12)
    for model_init in (None, summarization.model):
        ours = _trainer(raytrainer, tok, rows, str(tmp_path / "rt"), num_workers=0, model_init=model_init,
                        **options).predict(rows)
        np.testing.assert_array_equal(ours.predictions, theirs.predictions)
        assert ours.metrics["test_ordered_chars"] == theirs.metrics["test_ordered_chars"]


def test_compute_metrics_given_logits_names_itself_and_predict_with_generate(tmp_path):
    tok = summarization.tokenizer()
    rows = summarization.dataset(tok)
    trainer = _trainer(raytrainer, tok, rows, str(tmp_path), trainer_class="Trainer", num_workers=0)
    with pytest.raises(TypeError, match=r"compute_metrics raised TypeError: .* logits \(float, shape \(7, \d+, 64\)\)"
                                        r".*Seq2SeqTrainingArguments\(predict_with_generate=True\)"):
        trainer.evaluate(rows)
