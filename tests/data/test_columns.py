"""What evaluation keeps of a model's outputs: the predictions, never the loss or a generation cache."""

import types

import torch

from raytrainer.data.columns import default_ignore_keys, extract_logits


class Cache:
    """Stands for transformers' DynamicCache: an output that is no tensor and cannot be concatenated."""


def test_a_config_without_keys_to_ignore_drops_the_cache_as_transformers_5_24_does():
    logits = torch.ones(2, 3)
    model = types.SimpleNamespace(config=types.SimpleNamespace())  # transformers >= 5.24: no attribute
    outputs = {"loss": torch.tensor(1.0), "logits": logits, "cache": Cache()}
    assert extract_logits(outputs, default_ignore_keys(model)) is logits


def test_a_config_naming_its_keys_and_a_plain_model():
    older = types.SimpleNamespace(config=types.SimpleNamespace(keys_to_ignore_at_inference=["past_key_values"]))
    assert default_ignore_keys(older) == ["past_key_values"]  # transformers < 5.24 names them on the config
    assert default_ignore_keys(torch.nn.Linear(2, 2)) == []  # no config: every output is a prediction
    both = extract_logits({"logits": torch.ones(1), "hidden": torch.zeros(1)}, [])
    assert isinstance(both, tuple) and len(both) == 2


def test_the_column_filter_drops_unused_columns_and_never_writes_to_a_dataset_row():
    from raytrainer.data.collator import DefaultCollator
    from raytrainer.data.columns import ColumnFilter

    rows = [{"x": torch.ones(3), "label": 1, "text": "a"}, {"x": torch.zeros(3), "label": 0, "text": "b"}]
    kept = [{"x": r["x"], "label": r["label"]} for r in rows]

    def renaming(features):  # a user's collator that renames in place, as some of transformers' once did
        for f in features:
            f["labels"] = f.pop("label")
        return {"x": torch.stack([f["x"] for f in features]), "labels": torch.tensor([f["labels"] for f in features])}

    for collator in (DefaultCollator(), renaming):
        batch = ColumnFilter(collator, ["x"], reads_only=isinstance(collator, DefaultCollator))(rows)
        assert sorted(batch) == ["labels", "x"] and batch["labels"].tolist() == [1, 0]
        assert [sorted(r) for r in rows] == [["label", "text", "x"]] * 2  # the dataset's rows as they were
        # Rows with nothing to drop go to DefaultCollator as they are, and still come out unchanged.
        batch = ColumnFilter(collator, ["x"], reads_only=isinstance(collator, DefaultCollator))(kept)
        assert batch["labels"].tolist() == [1, 0] and [sorted(r) for r in kept] == [["label", "x"]] * 2
