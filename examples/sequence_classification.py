"""Sequence classification with `compute_metrics`: a tiny BERT learns which topic a token sequence is about.

Shows: a Hugging Face model built from a config (`BertForSequenceClassification`, no pretrained weights), a
`datasets.Dataset` with a `label` column (the default collator renames it to `labels`), and accuracy computed
by `compute_metrics` at every evaluation. The data is generated in code: each of `num_labels` topics owns a
band of the vocabulary, and a sequence mixes noise with tokens of its topic's band, so nothing is downloaded.

Run it locally (an embedded Ray with 2 workers; `--num_workers 0` runs in this process):

    python examples/sequence_classification.py
    python examples/sequence_classification.py --max_steps 300 --learning_rate 1e-3 --num_workers 0
    python examples/sequence_classification.py my_config.yaml --seed 1   # any field, from a file

or on a Ray cluster (token authentication on, as Ray 2.60 clusters are by default):

    RAY_AUTH_MODE=token ray job submit --address http://HEAD:8265 --working-dir . -- \\
        python examples/sequence_classification.py --num_workers 2 --output_dir s3://bucket/runs/seqcls
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import numpy as np

from raytrainer import ArgumentParser, TrainingArguments


@dataclass
class DataArguments:
    num_labels: int = field(default=4, metadata={"help": "Topics (classes)."})
    seq_len: int = field(default=32, metadata={"help": "Tokens per sequence."})
    train_samples: int = field(default=2048, metadata={"help": "Generated training sequences."})
    eval_samples: int = field(default=256, metadata={"help": "Generated evaluation sequences."})
    topic_share: float = field(default=0.3, metadata={"help": "Share of a sequence's tokens from its topic's band "
                                                               "(the rest is uniform noise)."})


BAND = 16  # vocabulary ids per topic; ids 0..BAND-1 are left to special tokens


def make_dataset(n: int, data: DataArguments, seed: int):
    """`n` sequences of `seq_len` token ids with a `label` column; deterministic given `seed`."""
    import datasets

    rng = np.random.default_rng(seed)
    vocab = BAND * (data.num_labels + 1)
    labels = rng.integers(0, data.num_labels, size=n)
    ids = rng.integers(BAND, vocab, size=(n, data.seq_len))
    on_topic = rng.random((n, data.seq_len)) < data.topic_share
    topic_ids = BAND * (labels[:, None] + 1) + rng.integers(0, BAND, size=(n, data.seq_len))
    ids = np.where(on_topic, topic_ids, ids)
    return datasets.Dataset.from_dict({"input_ids": ids.tolist(), "label": labels.tolist()})


def build_model(data: DataArguments):
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=BAND * (data.num_labels + 1), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=data.seq_len,
                        num_labels=data.num_labels)
    return BertForSequenceClassification(config)


def accuracy(eval_pred):
    """`compute_metrics`: logits and labels arrive gathered from every worker, in dataset order."""
    logits, labels = eval_pred
    return {"accuracy": float((np.argmax(logits, axis=-1) == labels).mean())}


def build_parser() -> ArgumentParser:
    parser = ArgumentParser([DataArguments, TrainingArguments], description=__doc__.splitlines()[0])
    parser.set_defaults(output_dir="runs/sequence_classification", num_workers=2, max_steps=200,
                        per_device_train_batch_size=32, per_device_eval_batch_size=64, learning_rate=2e-3,
                        warmup_steps=0.1, logging_steps=20, eval_strategy="steps", eval_steps=100,
                        save_steps=100, save_total_limit=2)
    return parser


def main(argv: list[str] | None = None) -> dict:
    import torch

    from raytrainer import Trainer

    data, args = build_parser().parse_args_into_dataclasses(argv)
    torch.manual_seed(args.seed)
    trainer = Trainer(model=build_model(data), args=args,
                      train_dataset=make_dataset(data.train_samples, data, seed=args.seed),
                      eval_dataset=make_dataset(data.eval_samples, data, seed=args.seed + 1),
                      compute_metrics=accuracy)
    output = trainer.train()
    evals = [entry for entry in trainer.state.log_history if "eval_accuracy" in entry]
    print(f"\ntrained {output.global_step} steps on {args.num_workers} workers; train loss "
          f"{output.training_loss:.3f}; eval accuracy " + " -> ".join(f"{e['eval_accuracy']:.3f}" for e in evals)
          + f" (chance: {1 / data.num_labels:.3f})")
    print(f"checkpoints: raytrainer checkpoints {args.output_dir}")
    return {"train_output": output, "log_history": trainer.state.log_history}


if __name__ == "__main__":
    main(sys.argv[1:])
