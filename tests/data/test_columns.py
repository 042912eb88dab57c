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
