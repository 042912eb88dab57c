"""`Seq2SeqTrainer`: the Trainer for translation and summarization, with transformers' meaning.

With `Seq2SeqTrainingArguments(predict_with_generate=True)`, evaluate() and predict() generate on every worker
(worker/generation.py) and `compute_metrics` gets the generated token ids, gathered in dataset order, so that
transformers' run_summarization / run_translation run by changing the import. The keyword arguments of generate
are resolved as transformers resolves them: `evaluate/predict(max_length=, num_beams=, **gen_kwargs)` first, then
`generation_max_length` / `generation_num_beams`, then the model's generation config (or `generation_config`).
They travel to the workers with the trainer (`_gen_kwargs`), and the evaluations inside train() resolve them
again through `evaluate`, as transformers' do.
"""

from __future__ import annotations

from copy import deepcopy
from pathlib import Path
from typing import Any, Optional

from .arguments.seq2seq_args import Seq2SeqTrainingArguments
from .state import PredictionOutput
from .trainer import Trainer
from .worker.generation import generation_step, resolve_gen_kwargs


class Seq2SeqTrainer(Trainer):
    def __init__(self, model=None, args: Optional[Seq2SeqTrainingArguments] = None, data_collator=None,
                 train_dataset=None, eval_dataset=None, processing_class=None, model_init=None,
                 compute_loss_func=None, compute_metrics=None, callbacks=None, optimizers=(None, None),
                 preprocess_logits_for_metrics=None):
        super().__init__(model=model, args=args if args is not None else Seq2SeqTrainingArguments(),
                         data_collator=data_collator, train_dataset=train_dataset, eval_dataset=eval_dataset,
                         processing_class=processing_class, model_init=model_init,
                         compute_loss_func=compute_loss_func, compute_metrics=compute_metrics, callbacks=callbacks,
                         optimizers=optimizers, preprocess_logits_for_metrics=preprocess_logits_for_metrics)
        # A plain TrainingArguments has no generation fields: it evaluates as the Trainer does.
        config = getattr(self.args, "generation_config", None)
        # Loaded and validated here, on the driver, as transformers does: a bad file fails before any worker.
        self._generation_config = None if config is None else self.load_generation_config(config)
        if self._generation_config is not None and self.model is not None:
            self.model.generation_config = self._generation_config
        self._gen_kwargs: dict = {}

    @staticmethod
    def load_generation_config(gen_config_arg: Any):
        """A GenerationConfig (copied), or one read from a directory or a file of it; validated strictly."""
        from transformers import GenerationConfig

        if isinstance(gen_config_arg, GenerationConfig):
            config = deepcopy(gen_config_arg)
        else:
            path = Path(gen_config_arg)
            if path.is_file():
                config = GenerationConfig.from_pretrained(path.parent, path.name)
            else:
                config = GenerationConfig.from_pretrained(path if path.is_dir() else gen_config_arg)
        try:
            config.validate(strict=True)
        except ValueError as exc:
            raise ValueError(f"{exc}\n\nFix these issues of generation_config to train your model.") from None
        return config

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval", **gen_kwargs) -> dict:
        self._gen_kwargs = resolve_gen_kwargs(self.args, gen_kwargs)
        return super().evaluate(eval_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def predict(self, test_dataset, ignore_keys=None, metric_key_prefix: str = "test",
                **gen_kwargs) -> PredictionOutput:
        self._gen_kwargs = resolve_gen_kwargs(self.args, gen_kwargs)
        return super().predict(test_dataset, ignore_keys=ignore_keys, metric_key_prefix=metric_key_prefix)

    def prediction_step(self, model, inputs: dict, prediction_loss_only: bool, ignore_keys=None, **gen_kwargs):
        """Runs on the workers. Without predict_with_generate (or for the loss only), the Trainer's step."""
        if not getattr(self.args, "predict_with_generate", False) or prediction_loss_only:
            return super().prediction_step(model, inputs, prediction_loss_only=prediction_loss_only,
                                           ignore_keys=ignore_keys)
        return generation_step(self, model, inputs, gen_kwargs or self._gen_kwargs)
