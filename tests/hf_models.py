"""Tiny transformers models of each family, built from configs (nothing downloaded), and rows of different
lengths for them: the shapes the numbers tests compare with transformers' own Trainer."""

from __future__ import annotations

import torch

VOCAB = 64
FAMILIES = ("llama", "gpt2", "bert_classifier", "t5", "plain")


def tiny_model(family: str, seed: int = 0, dropout: float = 0.0, **config) -> torch.nn.Module:
    """A tiny model of `family`; `config` overrides fields of its transformers config (the one place the
    suite's tiny configs are written)."""
    import transformers as hf

    from tests.models import TinyLM

    torch.manual_seed(seed)
    if family == "llama":  # decoder-only whose loss takes num_items_in_batch (shift-aware loss kwargs)
        return hf.LlamaForCausalLM(hf.LlamaConfig(**{**dict(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, attention_dropout=dropout), **config}))
    if family == "gpt2":  # decoder-only whose loss_type transformers' Trainer does not recognise
        return hf.GPT2LMHeadModel(hf.GPT2Config(**{**dict(
            vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=64, bos_token_id=1, eos_token_id=2,
            resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout), **config}))
    if family == "bert_classifier":  # takes **kwargs but ignores num_items_in_batch (returns its own mean)
        return hf.BertForSequenceClassification(hf.BertConfig(**{**dict(
            vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
            max_position_embeddings=64, num_labels=3, hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout), **config}))
    if family == "t5":  # encoder-decoder: labels are not shifted for the count
        return hf.T5ForConditionalGeneration(hf.T5Config(**{**dict(
            vocab_size=VOCAB, d_model=32, d_ff=64, d_kv=8, num_layers=2, num_heads=4, dropout_rate=dropout,
            decoder_start_token_id=0, pad_token_id=0, eos_token_id=1), **config}))
    if family == "plain":  # a plain nn.Module returning a token-mean loss
        return TinyLM(vocab=VOCAB, dim=16)
    raise ValueError(family)


def tiny_rows(family: str, n: int = 8, seed: int = 0) -> list:
    """`n` rows of 4..15 tokens (padded differently in every micro-batch split), with -100 in some labels."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        length = int(torch.randint(4, 16, (1,), generator=g))
        ids = torch.randint(3, VOCAB, (length,), generator=g)
        if family == "bert_classifier":
            labels = i % 3
        elif family == "t5":
            labels = torch.randint(3, VOCAB, (int(torch.randint(2, 9, (1,), generator=g)),), generator=g)
        else:
            labels = ids.clone() if family != "plain" else (ids + 1) % VOCAB
            labels[torch.rand(length, generator=g) < 0.15] = -100
        rows.append({"input_ids": ids, "labels": labels})
    return rows
