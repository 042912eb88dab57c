import pickle

import numpy as np
import pytest
import torch

from raytrainer.data.collator import DefaultCollator, pad_token_id_of
from raytrainer.errors import ConfigError


def test_equal_shapes_stack_with_python_dtypes():
    batch = DefaultCollator()([{"x": [1.0, 2.0], "n": 3, "flag": True}, {"x": [3.0, 4.0], "n": 4, "flag": False}])
    assert batch["x"].dtype == torch.float32 and batch["x"].shape == (2, 2)
    assert batch["n"].dtype == torch.int64 and batch["n"].tolist() == [3, 4]
    assert batch["flag"].dtype == torch.bool
    assert "attention_mask" not in batch  # nothing was padded


@pytest.mark.parametrize("alias", ["label", "label_ids"])
def test_label_aliases_become_labels(alias):
    batch = DefaultCollator()([{"x": [1], alias: 1}, {"x": [2], alias: 0}])
    assert alias not in batch and batch["labels"].tolist() == [1, 0]
    assert batch["labels"].dtype == torch.int64
    assert DefaultCollator()([{alias: 0.5}, {alias: 1.5}])["labels"].dtype == torch.float32  # regression targets


def test_label_and_labels_together_is_an_error():
    with pytest.raises(ConfigError, match="labels"):
        DefaultCollator()([{"label": 1, "labels": 1}])


def test_padding_right_with_per_key_values_and_created_mask():
    features = [{"input_ids": [5, 6, 7], "labels": [1, 2, 3], "token_type_ids": [1, 1, 1], "other": [9, 9, 9]},
                {"input_ids": [8], "labels": [4], "token_type_ids": [1], "other": [9]}]
    batch = DefaultCollator(pad_token_id=2)(features)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [8, 2, 2]]
    assert batch["labels"].tolist() == [[1, 2, 3], [4, -100, -100]]
    assert batch["token_type_ids"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["other"].tolist() == [[9, 9, 9], [9, 0, 0]]
    # From lengths, not from the pad id: token 2 is a real token in neither row here, but it could be.
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["attention_mask"].dtype == torch.int64


def test_padding_left_and_given_attention_mask_is_padded_not_replaced():
    features = [{"input_ids": [5, 6], "attention_mask": [0, 1]}, {"input_ids": [7], "attention_mask": [1]}]
    batch = DefaultCollator(pad_token_id=2, padding_side="left")(features)
    assert batch["input_ids"].tolist() == [[5, 6], [2, 7]]
    assert batch["attention_mask"].tolist() == [[0, 1], [0, 1]]


def test_pad_id_that_is_also_a_real_token():
    batch = DefaultCollator(pad_token_id=0)([{"input_ids": [0, 3]}, {"input_ids": [4]}])
    assert batch["attention_mask"].tolist() == [[1, 1], [1, 0]]


def test_numpy_and_tensor_values():
    features = [{"input_ids": np.array([1, 2], dtype=np.int32), "pixel": torch.ones(2, 2),
                 "score": np.float64(0.5), "emb": np.zeros(3)},
                {"input_ids": np.array([3], dtype=np.int32), "pixel": torch.zeros(2, 2),
                 "score": np.float64(1.5), "emb": np.ones(3)}]
    batch = DefaultCollator()(features)
    assert batch["input_ids"].dtype == torch.int64 and batch["input_ids"].tolist() == [[1, 2], [3, 0]]
    assert batch["pixel"].shape == (2, 2, 2)
    assert batch["score"].dtype == torch.float32 and batch["emb"].dtype == torch.float32


def test_strings_dropped_and_error_when_nothing_numeric_remains():
    batch = DefaultCollator()([{"text": "a b", "tokens": ["a", "b"], "input_ids": [1, 2]},
                               {"text": "c", "tokens": ["c"], "input_ids": [3]}])
    assert set(batch) == {"input_ids", "attention_mask"}
    with pytest.raises(ConfigError, match="text"):
        DefaultCollator()([{"text": "a"}, {"text": "b"}])


@pytest.mark.parametrize("features, match", [
    ([], "empty"),
    ([[1, 2]], "dicts"),
    ([{"x": 1}, {"y": 1}], "'x', 'y'"),
    ([{"x": 1}, {"x": 1, "y": 1}], "'y'"),
    ([{"x": [[1, 2]]}, {"x": [[1]]}], "'x'"),
    ([{"x": "a"}, {"x": 1}], "'x'"),
    ([{"x": object()}], "'x'"),
])
def test_bad_inputs_are_config_errors(features, match):
    with pytest.raises(ConfigError, match=match):
        DefaultCollator()(features)


def test_bad_padding_side():
    with pytest.raises(ConfigError, match="padding_side"):
        DefaultCollator(padding_side="middle")


@pytest.mark.parametrize("fmt", [None, "numpy", "torch"])
def test_datasets_rows_give_the_same_batch_in_every_format(fmt):
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4]], "label": [1, 0],
                                     "score": [0.5, 1.0], "text": ["abc", "d"]})
    if fmt:
        ds = ds.with_format(fmt)
    batch = DefaultCollator(pad_token_id=9)([ds[0], ds[1]])
    assert set(batch) == {"input_ids", "attention_mask", "labels", "score"}
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 9, 9]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].dtype == torch.int64 and batch["score"].dtype == torch.float32


def test_collator_pickles():
    collator = pickle.loads(pickle.dumps(DefaultCollator(pad_token_id=3)))
    assert collator.pad_token_id == 3


def test_pad_token_id_of():
    class Tok:
        pad_token_id = 7

    class NoPad:
        pad_token_id = None

    class Processor:
        tokenizer = Tok()

    assert pad_token_id_of(Tok()) == 7
    assert pad_token_id_of(NoPad()) == 0
    assert pad_token_id_of(None) == 0
    assert pad_token_id_of(Processor()) == 7
