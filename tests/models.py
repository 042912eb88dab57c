"""Small models and data for the tests, built in code (nothing is downloaded)."""

from __future__ import annotations

import torch
from torch import nn

VOCAB = 32


class TinyLM(nn.Module):
    """Token-level model whose loss is the mean over label tokens that are not -100 (as HF models)."""

    def __init__(self, vocab: int = VOCAB, dim: int = 16, dropout: float = 0.0):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()  # a random stream resume must continue
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids, attention_mask=None, labels=None, idx=None):
        logits = self.head(self.norm(self.drop(self.emb(input_ids))))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
        return out


class NoLossModel(TinyLM):
    def forward(self, input_ids, attention_mask=None, labels=None, idx=None):
        return {"logits": super().forward(input_ids)["logits"]}


class TokenData(torch.utils.data.Dataset):
    """Variable-length sequences (3..8 tokens); the label is the next token id modulo the vocabulary, and
    some label positions are -100, so token counts differ between batches."""

    def __init__(self, n: int, seed: int = 0, with_labels: bool = True):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for i in range(n):
            length = int(torch.randint(3, 9, (1,), generator=g))
            ids = torch.randint(0, VOCAB, (length,), generator=g)
            item = {"input_ids": ids, "idx": i}
            if with_labels:
                labels = (ids + 1) % VOCAB
                labels[torch.rand(length, generator=g) < 0.2] = -100
                item["labels"] = labels
            self.items.append(item)

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def make_model(seed: int = 0, dropout: float = 0.0) -> TinyLM:
    torch.manual_seed(seed)
    return TinyLM(dropout=dropout)


class MaskingCollator:
    """A masked-LM collator's randomness: each label is hidden (-100) with probability 0.15, drawn from torch's
    global stream when the batch is made, as transformers' DataCollatorForLanguageModeling draws its masks."""

    def __init__(self):
        from raytrainer.data.collator import DefaultCollator

        self.inner = DefaultCollator()

    def __call__(self, features):
        batch = self.inner(features)
        labels = batch["labels"].clone()
        labels[torch.rand(labels.shape) < 0.15] = -100
        batch["labels"] = labels
        return batch


def weights(model: nn.Module) -> dict:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def assert_same_weights(a: dict, b: dict, atol: float = 1e-5):
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], atol=atol, rtol=1e-4, msg=f"weights differ at {key}")
