"""Every transformers TrainingArguments field is accepted by ours and classified (same / different / refused),
docs/arguments.md's table is what the classes generate, and each refused field refuses with a ConfigError."""

import dataclasses
import os

import pytest

from raytrainer import ConfigError, TrainingArguments
from raytrainer.arguments.docs_table import markdown_table, table_in
from raytrainer.arguments.transformers_fields import DIFFERENT, HF_FIELDS, OURS_FIELDS, REFUSED, SAME, field_default
from tests.support import ROOT

transformers = pytest.importorskip("transformers")

DOCS = os.path.join(ROOT, "docs", "arguments.md")
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


def test_docs_table_is_the_generated_one():
    with open(DOCS, encoding="utf-8") as f:
        documented = table_in(f.read())
    assert documented == markdown_table(), (
        "docs/arguments.md's table is stale: run `python -m raytrainer.arguments.docs_table docs/arguments.md`")


def _other_value(name: str):
    """A value transformers accepts for a refused field that is not its default."""
    default = field_default(TrainingArguments, name)
    special = {"include_for_metrics": ["inputs"], "debug": "underflow_overflow", "accelerator_config":
               {"split_batches": True}, "deepspeed": {"zero_optimization": {"stage": 2}}, "parallelism_config": "x",
               "trackio_static_space_id": False}
    if name in special:
        return special[name]
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 7
    return "other"


@pytest.mark.parametrize("name", [n for n, (status, _) in HF_FIELDS.items() if status == REFUSED])
def test_refused_fields_name_the_field_why_and_the_fix(name):
    TrainingArguments(**{name: field_default(TrainingArguments, name)})  # the default is accepted
    with pytest.raises(ConfigError, match=rf"^{name}=.* is not supported .*: {HF_FIELDS[name][1][:20]}"):
        TrainingArguments(**{name: _other_value(name)})


def test_push_to_hub_is_accepted_not_a_type_error():
    args = TrainingArguments(output_dir="out", push_to_hub=True, hub_model_id="me/model")
    assert args.push_to_hub and args.hub_model_id == "me/model"
