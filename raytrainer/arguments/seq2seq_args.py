"""`Seq2SeqTrainingArguments`: `TrainingArguments` plus transformers' generation fields, with transformers' names,
defaults and meanings (`predict_with_generate`, `generation_max_length`, `generation_num_beams`,
`generation_config`, `sortish_sampler`). `raytrainer.Seq2SeqTrainer` reads them (seq2seq_trainer.py); the worker's
generation step is worker/generation.py.

The fields are checked at construction, after TrainingArguments' own checks: a bad value fails on the driver.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .training_args import TrainingArguments, _help


@dataclass
class Seq2SeqTrainingArguments(TrainingArguments):
    sortish_sampler: bool = _help("Accepted for transformers' scripts; transformers 5 reads it nowhere either.",
                                  default=False)
    predict_with_generate: bool = _help(
        "evaluate()/predict() generate (model.generate) and hand compute_metrics the generated token ids, for "
        "generative metrics (ROUGE, BLEU); otherwise it gets the logits.", default=False)
    generation_max_length: int | None = _help(
        "The max_length of generate in each evaluation with predict_with_generate; default: the model's "
        "generation config. evaluate/predict(max_length=... or max_new_tokens=...) override it.", default=None)
    generation_num_beams: int | None = _help(
        "The num_beams of generate in each evaluation with predict_with_generate; default: the model's "
        "generation config. evaluate/predict(num_beams=...) overrides it.", default=None)
    # transformers also types it GenerationConfig; that class is not named here so that the arguments need not
    # import transformers (a GenerationConfig object is accepted all the same, and checked below).
    generation_config: str | Path | None = _help(
        "A GenerationConfig, or a local directory / file of one (GenerationConfig.from_pretrained), set as the "
        "model's generation_config by Seq2SeqTrainer.", default=None)

    def __post_init__(self):
        super().__post_init__()
        check_generation_fields(self)

    def to_dict(self) -> dict:
        """As transformers: a GenerationConfig becomes its dict (JSON-serialisable)."""
        out = super().to_dict()
        for key, value in out.items():
            if hasattr(value, "to_dict") and type(value).__name__ == "GenerationConfig":
                out[key] = value.to_dict()
        return out


def check_generation_fields(args: Any) -> None:
    for name in ("generation_max_length", "generation_num_beams"):
        value = getattr(args, name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ConfigError(f"{name}={value!r} must be a positive int (or None for the model's generation "
                              "config).")
    config = args.generation_config
    if config is not None and not isinstance(config, (str, Path)) and type(config).__name__ != "GenerationConfig":
        raise ConfigError(f"generation_config={config!r} must be a transformers GenerationConfig, or the path of a "
                          "directory or file holding one (GenerationConfig.save_pretrained).")
