"""Quick start: a tiny GPT-2 learns to continue Python's own documentation, on 2 Ray workers.

The text is the help topics that ship with CPython (`pydoc_data.topics`), encoded as bytes, so nothing is
downloaded. The model is built from a config (no pretrained weights). Runs on an embedded local Ray:

    python examples/quickstart.py                      # 2 workers, ~1 minute on a 2-core CPU
    python examples/quickstart.py --num_workers 4 --max_steps 400 --output_dir s3://bucket/run
    python examples/quickstart.py config.yaml          # any TrainingArguments field, from a file
"""

import sys
from dataclasses import dataclass, field

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from raytrainer import ArgumentParser, Trainer, TrainingArguments


@dataclass
class ModelArguments:
    block_size: int = field(default=64, metadata={"help": "Tokens (bytes) per training sequence."})
    n_embd: int = field(default=64, metadata={"help": "Hidden size."})
    n_layer: int = field(default=2, metadata={"help": "Transformer layers."})
    eval_blocks: int = field(default=101, metadata={"help": "Held-out sequences for evaluation."})


class ByteBlocks(torch.utils.data.Dataset):
    """Fixed-length windows of UTF-8 bytes; GPT-2 shifts the labels itself."""

    def __init__(self, data: np.ndarray, block_size: int):
        self.data, self.block_size = data, block_size

    def __len__(self):
        return len(self.data) // self.block_size

    def __getitem__(self, i):
        ids = torch.from_numpy(self.data[i * self.block_size:(i + 1) * self.block_size].astype(np.int64))
        return {"input_ids": ids, "labels": ids.clone()}


def load_text() -> np.ndarray:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[name] for name in sorted(topics))
    return np.frombuffer(text.encode("utf-8"), dtype=np.uint8)


def next_byte_accuracy(eval_pred):
    preds, labels = eval_pred
    return {"accuracy": float((preds[:, :-1] == labels[:, 1:]).mean())}


def build_parser() -> ArgumentParser:
    parser = ArgumentParser([ModelArguments, TrainingArguments], description=__doc__.splitlines()[0])
    parser.set_defaults(output_dir="runs/quickstart", num_workers=2, max_steps=600, per_device_train_batch_size=16,
                        learning_rate=3e-3, warmup_steps=0.05, lr_scheduler_type="cosine", logging_steps=25,
                        eval_strategy="steps", eval_steps=200, eval_on_start=True, save_steps=200, save_total_limit=2,
                        per_device_eval_batch_size=32)
    return parser


def main(argv=None):
    model_args, args = build_parser().parse_args_into_dataclasses(argv)

    data = load_text()
    split = len(data) - model_args.eval_blocks * model_args.block_size
    train, held_out = ByteBlocks(data[:split], model_args.block_size), ByteBlocks(data[split:], model_args.block_size)
    config = GPT2Config(vocab_size=256, n_positions=model_args.block_size, n_embd=model_args.n_embd,
                        n_layer=model_args.n_layer, n_head=4, bos_token_id=0, eos_token_id=0)  # byte vocabulary
    torch.manual_seed(args.seed)
    trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=train, eval_dataset=held_out,
                      compute_metrics=next_byte_accuracy,
                      preprocess_logits_for_metrics=lambda logits, labels: logits.argmax(-1))
    # eval_on_start evaluates at step 0 and the last eval_steps interval ends at max_steps: the "before" and
    # "after" evaluations run inside the training's worker group (a separate evaluate() call starts a group
    # of its own, ~10 s on a small machine).
    output = trainer.train()
    print(f"\ntrained {output.global_step} steps on {args.num_workers} workers in "
          f"{output.metrics['train_runtime']:.0f} s; train loss {output.training_loss:.3f}")
    evaluations = [e for e in trainer.state.log_history if "eval_loss" in e]
    if evaluations:
        before, after = evaluations[0], evaluations[-1]
        print(f"eval loss {before['eval_loss']:.3f} (step {before['step']}) -> {after['eval_loss']:.3f} (step "
              f"{after['step']}), next-byte accuracy {before['eval_accuracy']:.3f} -> {after['eval_accuracy']:.3f}")
    trainer.save_model(f"{args.output_dir}/final")
    print(f"model saved to {args.output_dir}/final (checkpoints: raytrainer checkpoints {args.output_dir})")


if __name__ == "__main__":
    main(sys.argv[1:])
