"""A tiny model made of repeated blocks (what FSDP shards and activation checkpointing recomputes), and a
helper to train it the same way with different strategies, world sizes and precisions."""

from __future__ import annotations

import torch
from torch import nn

from raytrainer import Trainer, TrainingArguments
from tests.models import VOCAB, TokenData


class TinyBlocks(nn.Module):
    """Embedding, two transformer encoder layers, a head; the loss is the mean over label tokens."""

    def __init__(self, dim: int = 16, depth: int = 2):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, dim)
        # No biases: attention's key bias has a zero gradient in exact arithmetic, so its gradient is rounding
        # noise, which AdamW turns into full-size updates that differ between any two reduction orders.
        self.blocks = nn.ModuleList([nn.TransformerEncoderLayer(dim, 2, 2 * dim, dropout=0.0, batch_first=True,
                                                                bias=False) for _ in range(depth)])
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, input_ids, attention_mask=None, labels=None, idx=None):
        hidden = self.emb(input_ids)
        for block in self.blocks:
            hidden = block(hidden)
        logits = self.head(hidden)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(),
                                                      ignore_index=-100)
        return out


def make_blocks(seed: int = 0) -> TinyBlocks:
    torch.manual_seed(seed)
    return TinyBlocks()


def blocks_args(output_dir: str, **kw) -> TrainingArguments:
    base = dict(output_dir=output_dir, num_workers=2, per_device_train_batch_size=2, max_steps=6,
                learning_rate=1e-2, optim="adamw_torch", max_grad_norm=0.5, logging_steps=1, save_strategy="no",
                disable_tqdm=True, seed=3)
    base.update(kw)
    return TrainingArguments(**base)


def train_blocks(output_dir: str, n: int = 24, trainer_cls=Trainer, resume=None, eval_n: int = 0, **kw) -> Trainer:
    trainer = trainer_cls(model=make_blocks(), args=blocks_args(output_dir, **kw), train_dataset=TokenData(n),
                          eval_dataset=TokenData(eval_n, seed=9) if eval_n else None)
    trainer.train(resume_from_checkpoint=resume)
    return trainer
