"""Every transformers TrainingArguments field is accepted by ours and classified (same / different / refused),
and every other field of ours is declared as ours."""

import dataclasses

import pytest

from raytrainer import TrainingArguments
from raytrainer.arguments.training_args import OURS_FIELDS
from raytrainer.arguments.transformers_fields import DIFFERENT, HF_FIELDS, REFUSED, SAME

transformers = pytest.importorskip("transformers")

HF_NAMES = [f.name for f in dataclasses.fields(transformers.TrainingArguments)]
OUR_NAMES = {f.name for f in dataclasses.fields(TrainingArguments)}


def test_every_transformers_field_is_accepted_and_classified():
    unaccepted = [n for n in HF_NAMES if n not in OUR_NAMES]
    unclassified = [n for n in HF_NAMES if n not in HF_FIELDS]
    assert not unaccepted, f"transformers fields TrainingArguments does not accept: {unaccepted}"
    assert not unclassified, ("transformers fields missing from raytrainer/arguments/transformers_fields.py: "
                              f"{unclassified}")
    assert set(HF_FIELDS) <= set(HF_NAMES), "transformers_fields.py classifies fields transformers does not have"
    assert {status for status, _ in HF_FIELDS.values()} <= {SAME, DIFFERENT, REFUSED}
    for name, (status, note) in HF_FIELDS.items():
        assert status == SAME or note, f"{name}: a {status} field needs a note saying why"
    assert OUR_NAMES - set(HF_NAMES) == set(OURS_FIELDS)

