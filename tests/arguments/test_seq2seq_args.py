"""Seq2SeqTrainingArguments: transformers' generation fields with its defaults, checked at construction, parsed
from the command line as transformers' HfArgumentParser parses them; transformers' own arguments classes refused by
the Trainer at construction, naming the class to use."""

from __future__ import annotations

import dataclasses

import pytest

from raytrainer import ArgumentParser, ConfigError, Seq2SeqTrainer, Seq2SeqTrainingArguments, Trainer
from tests.models import make_model

transformers = pytest.importorskip("transformers")


def test_every_generation_field_of_transformers_with_its_default():
    base = {f.name for f in dataclasses.fields(transformers.TrainingArguments)}
    theirs = {f.name: f.default for f in dataclasses.fields(transformers.Seq2SeqTrainingArguments)
              if f.name not in base}
    ours = {f.name: f.default for f in dataclasses.fields(Seq2SeqTrainingArguments)}
    assert theirs and {name: ours.get(name, "missing") for name in theirs} == theirs


def test_parsed_from_the_command_line_as_transformers_parses_them(tmp_path):
    argv = ["--output_dir", str(tmp_path), "--predict_with_generate", "--generation_max_length", "12",
            "--generation_num_beams", "3", "--generation_config", str(tmp_path / "gen"), "--num_workers", "0"]
    (ours,) = ArgumentParser(Seq2SeqTrainingArguments).parse_args_into_dataclasses(argv)
    (theirs,) = transformers.HfArgumentParser(transformers.Seq2SeqTrainingArguments).parse_args_into_dataclasses(
        argv[:-2])
    for name in ("predict_with_generate", "generation_max_length", "generation_num_beams", "generation_config"):
        assert getattr(ours, name) == getattr(theirs, name), name
    assert ours.num_workers == 0 and ours.generation_num_beams == 3


def test_generation_fields_are_checked_at_construction():
    with pytest.raises(ConfigError, match="generation_num_beams=0 must be a positive int"):
        Seq2SeqTrainingArguments(generation_num_beams=0)
    with pytest.raises(ConfigError, match="generation_config=.*GenerationConfig"):
        Seq2SeqTrainingArguments(generation_config={"max_length": 5})


@pytest.mark.parametrize("theirs, ours", [("Seq2SeqTrainingArguments", "Seq2SeqTrainingArguments"),
                                          ("TrainingArguments", "TrainingArguments")])
def test_transformers_arguments_are_refused_naming_ours(tmp_path, theirs, ours):
    args = getattr(transformers, theirs)(output_dir=str(tmp_path), report_to="none")
    for trainer_class in (Trainer, Seq2SeqTrainer):
        with pytest.raises(ConfigError, match=f"needs raytrainer.{ours} .*from raytrainer import {ours}"):
            trainer_class(model=make_model(), args=args)
