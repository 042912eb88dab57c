"""Parts of the quick start as `module:function` references, for `raytrainer train examples/configs/tiny_lm.yaml`.

`raytrainer train` imports `examples.tiny_lm` (the current directory is on the import path, so run it from the
repository root, or under `ray job submit --working-dir .`), calls `model` and the dataset functions with the
config's `kwargs`, and hands `next_byte_accuracy` / `argmax_logits` to the Trainer as they are.
"""

from __future__ import annotations

import numpy as np

from examples.quickstart import ByteBlocks, load_text, next_byte_accuracy  # noqa: F401  (referenced by configs)


def model(block_size: int = 64, n_embd: int = 64, n_layer: int = 2, seed: int = 0):
    """A tiny GPT-2 over bytes, built from a config (no download)."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    return GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=block_size, n_embd=n_embd, n_layer=n_layer,
                                      n_head=4, bos_token_id=0, eos_token_id=0))


def _split(block_size: int, eval_blocks: int) -> tuple[np.ndarray, np.ndarray]:
    data = load_text()
    cut = len(data) - eval_blocks * block_size
    return data[:cut], data[cut:]


def train_dataset(block_size: int = 64, eval_blocks: int = 101, max_blocks: int | None = None) -> ByteBlocks:
    """Python's bundled help topics as byte windows, minus the held-out tail; `max_blocks` caps the size."""
    train, _ = _split(block_size, eval_blocks)
    if max_blocks is not None:
        train = train[:max_blocks * block_size]
    return ByteBlocks(train, block_size)


def eval_dataset(block_size: int = 64, eval_blocks: int = 101) -> ByteBlocks:
    return ByteBlocks(_split(block_size, eval_blocks)[1], block_size)


def argmax_logits(logits, labels):
    """`preprocess_logits_for_metrics`: keep the predicted ids, not the (batch, seq, 256) logits."""
    return logits.argmax(-1)
