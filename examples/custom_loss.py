"""A custom loss by subclassing: `CustomTrainer.compute_loss` with class-weighted cross-entropy over 3 classes.

Shows the Hugging Face recipe unchanged: a `Trainer` subclass overriding
`compute_loss(self, model, inputs, return_outputs=False)` (the signature older HF scripts use, without
`num_items_in_batch`). The subclass is shipped to every Ray worker and its `compute_loss` runs there. The
classes are imbalanced (about 60/30/10 %), which is why the rarer ones weigh more (1, 2, 3). The model is a
tiny `BertForSequenceClassification` built from a config and the data is generated in code.

Run it locally (an embedded Ray with 2 workers; `--num_workers 0` runs in this process):

    python examples/custom_loss.py
    python examples/custom_loss.py --num_workers 0 --max_steps 100 --class_weights 1 3 9
    python examples/custom_loss.py my_config.yaml     # any field, from a file

or on a Ray cluster (token authentication on, as Ray 2.60 clusters are by default):

    RAY_AUTH_MODE=token ray job submit --address http://HEAD:8265 --working-dir . -- \\
        python examples/custom_loss.py --num_workers 2 --output_dir s3://bucket/runs/custom_loss
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch
from torch import nn

from raytrainer import ArgumentParser, Trainer, TrainingArguments

NUM_LABELS = 3
BAND = 16  # vocabulary ids per class


@dataclass
class LossArguments:
    class_weights: List[float] = field(default_factory=lambda: [1.0, 2.0, 3.0],
                                       metadata={"help": "Cross-entropy weight of each of the 3 classes."})
    class_shares: List[float] = field(default_factory=lambda: [0.6, 0.3, 0.1],
                                      metadata={"help": "How often each class occurs in the generated data."})
    seq_len: int = field(default=24, metadata={"help": "Tokens per sequence."})
    class_token_share: float = field(default=0.5, metadata={"help": "Share of a sequence's tokens drawn from its "
                                                                     "class's vocabulary band (the rest is noise)."})
    train_samples: int = field(default=1536, metadata={"help": "Generated training sequences."})
    eval_samples: int = field(default=256, metadata={"help": "Generated evaluation sequences."})


class CustomTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False):
        labels = inputs.pop("labels")
        outputs = model(**inputs)
        logits = outputs.get("logits")
        # self.class_weights is an instance attribute: it travels to the workers with the trainer.
        loss_fct = nn.CrossEntropyLoss(weight=torch.tensor(self.class_weights, device=logits.device))
        loss = loss_fct(logits.view(-1, NUM_LABELS), labels.view(-1))
        return (loss, outputs) if return_outputs else loss


class WeightedClasses(torch.utils.data.Dataset):
    """Sequences whose class shows as a share of tokens from that class's vocabulary band."""

    def __init__(self, n: int, loss_args: LossArguments, seed: int):
        rng = np.random.default_rng(seed)
        shares = np.asarray(loss_args.class_shares, dtype=float)
        self.labels = rng.choice(NUM_LABELS, size=n, p=shares / shares.sum())
        noise = rng.integers(0, BAND * NUM_LABELS, size=(n, loss_args.seq_len))
        signal = BAND * self.labels[:, None] + rng.integers(0, BAND, size=(n, loss_args.seq_len))
        self.ids = np.where(rng.random((n, loss_args.seq_len)) < loss_args.class_token_share, signal, noise)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return {"input_ids": torch.from_numpy(self.ids[i]), "labels": int(self.labels[i])}


def per_class_recall(eval_pred):
    logits, labels = eval_pred
    preds = np.argmax(logits, axis=-1)
    metrics = {"accuracy": float((preds == labels).mean())}
    for c in range(NUM_LABELS):
        if (labels == c).any():
            metrics[f"recall_{c}"] = float((preds[labels == c] == c).mean())
    return metrics


def build_parser() -> ArgumentParser:
    parser = ArgumentParser([LossArguments, TrainingArguments], description=__doc__.splitlines()[0])
    parser.set_defaults(output_dir="runs/custom_loss", num_workers=2, max_steps=150, per_device_train_batch_size=32,
                        per_device_eval_batch_size=64, learning_rate=2e-3, warmup_steps=0.1, logging_steps=15,
                        eval_strategy="steps", eval_steps=75, save_steps=75, save_total_limit=1)
    return parser


def main(argv: list[str] | None = None) -> dict:
    from transformers import BertConfig, BertForSequenceClassification

    loss_args, args = build_parser().parse_args_into_dataclasses(argv)
    if len(loss_args.class_weights) != NUM_LABELS or len(loss_args.class_shares) != NUM_LABELS:
        raise SystemExit(f"--class_weights and --class_shares take {NUM_LABELS} numbers each")
    torch.manual_seed(args.seed)
    config = BertConfig(vocab_size=BAND * NUM_LABELS, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=loss_args.seq_len, num_labels=NUM_LABELS)
    trainer = CustomTrainer(model=BertForSequenceClassification(config), args=args,
                            train_dataset=WeightedClasses(loss_args.train_samples, loss_args, seed=args.seed),
                            eval_dataset=WeightedClasses(loss_args.eval_samples, loss_args, seed=args.seed + 1),
                            compute_metrics=per_class_recall)
    trainer.class_weights = list(loss_args.class_weights)
    output = trainer.train()
    final = [e for e in trainer.state.log_history if "eval_accuracy" in e][-1]
    print(f"\ntrained {output.global_step} steps on {args.num_workers} workers; weighted train loss "
          f"{output.training_loss:.3f}; eval accuracy {final['eval_accuracy']:.3f}, recall per class "
          + ", ".join(f"{c}: {final.get(f'eval_recall_{c}', float('nan')):.3f}" for c in range(NUM_LABELS)))
    return {"train_output": output, "log_history": trainer.state.log_history}


if __name__ == "__main__":
    main(sys.argv[1:])
