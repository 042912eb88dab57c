"""A Ray Data pipeline feeds training: tokenisation runs in `map_batches` on Ray Data's own actors.

Shows: `train_dataset` / `eval_dataset` given as `ray.data.Dataset`s. Each document (a help topic that ships
with CPython, so nothing is downloaded) is one row; a `map_batches` step with an actor pool encodes it to
bytes and cuts it into fixed-length blocks, on CPUs of its own, while the training workers train. Ray Train
streams each worker its share (`get_dataset_shard`); every block is trained on once per epoch. Ray cannot
know how many blocks the pipeline yields without running it, so the run is sized by `max_steps` (call
`.materialize()` on a dataset to train by `num_train_epochs` instead).

Run it locally (an embedded Ray with 2 training workers plus CPUs for Ray Data; `--num_workers 0` runs the
loop in this process):

    python examples/ray_data_lm.py
    python examples/ray_data_lm.py --max_steps 100 --num_workers 0
    python examples/ray_data_lm.py my_config.yaml --seed 1             # any field, from a file

or on a Ray cluster (token authentication on, as Ray 2.60 clusters are by default):

    RAY_AUTH_MODE=token ray job submit --address http://HEAD:8265 --working-dir . -- \\
        python examples/ray_data_lm.py --num_workers 2 --output_dir s3://bucket/runs/ray-data
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field

import numpy as np
import torch

from raytrainer import ArgumentParser, Trainer, TrainingArguments


@dataclass
class DataArguments:
    block_size: int = field(default=64, metadata={"help": "Tokens (bytes) per training sequence."})
    eval_topics: int = field(default=8, metadata={"help": "Help topics held out for evaluation."})
    tokenizer_actors: int = field(default=1, metadata={"help": "Ray Data actors running the tokenizer."})


class ByteTokenizer:
    """The `map_batches` step: documents in, fixed-length blocks of UTF-8 bytes out (the remainder of each
    document is dropped). A class, so Ray Data runs it in an actor pool (set-up paid once per actor)."""

    def __init__(self, block_size: int):
        self.block_size = block_size

    def __call__(self, batch: dict) -> dict:
        blocks = []
        for text in batch["text"]:
            data = np.frombuffer(str(text).encode("utf-8"), dtype=np.uint8).astype(np.int64)
            usable = len(data) // self.block_size * self.block_size
            blocks.extend(data[:usable].reshape(-1, self.block_size))
        blocks = np.stack(blocks) if blocks else np.zeros((0, self.block_size), dtype=np.int64)
        return {"input_ids": blocks, "labels": blocks.copy()}  # GPT-2 shifts the labels itself


def documents(eval_topics: int):
    from pydoc_data.topics import topics

    names = sorted(topics)
    return [{"text": topics[n]} for n in names[eval_topics:]], [{"text": topics[n]} for n in names[:eval_topics]]


def pipeline(rows, data: DataArguments):
    import ray

    return ray.data.from_items(rows).map_batches(ByteTokenizer, fn_constructor_args=(data.block_size,),
                                                 compute=ray.data.ActorPoolStrategy(size=data.tokenizer_actors),
                                                 batch_size=16)


def start_ray(args: TrainingArguments):
    """An embedded Ray (no cluster address given) gets CPUs for Ray Data besides those the training
    workers hold: on a small machine the workers would otherwise take every CPU and the pipeline would wait."""
    import ray

    if ray.is_initialized() or args.ray_address or os.environ.get("RAY_ADDRESS"):
        return
    from raytrainer.coordinator.cluster import connect

    ray.init(address="local", num_cpus=max(os.cpu_count() or 1, args.num_workers + 2), logging_level="WARNING",
             runtime_env={"env_vars": {"RAY_TRAIN_V2_ENABLED": "1"}})
    connect()  # the trainer's console filters on this Ray


def build_parser() -> ArgumentParser:
    parser = ArgumentParser([DataArguments, TrainingArguments], description=__doc__.splitlines()[0])
    parser.set_defaults(output_dir="runs/ray_data_lm", num_workers=2, max_steps=300, per_device_train_batch_size=16,
                        per_device_eval_batch_size=32, learning_rate=3e-3, warmup_steps=0.05,
                        lr_scheduler_type="cosine", logging_steps=25, eval_strategy="steps", eval_steps=150,
                        save_steps=150, save_total_limit=2)
    return parser


def main(argv=None):
    from transformers import GPT2Config, GPT2LMHeadModel

    data, args = build_parser().parse_args_into_dataclasses(argv)
    start_ray(args)
    train_docs, eval_docs = documents(data.eval_topics)
    config = GPT2Config(vocab_size=256, n_positions=data.block_size, n_embd=64, n_layer=2, n_head=4,
                        bos_token_id=0, eos_token_id=0)
    torch.manual_seed(args.seed)
    trainer = Trainer(model=GPT2LMHeadModel(config), args=args, train_dataset=pipeline(train_docs, data),
                      eval_dataset=pipeline(eval_docs, data))
    output = trainer.train()
    print(f"\ntrained {output.global_step} steps on {args.num_workers} workers in "
          f"{output.metrics['train_runtime']:.0f} s; train loss {output.training_loss:.3f}")
    return {"train_output": output, "log_history": trainer.state.log_history}


if __name__ == "__main__":
    main(sys.argv[1:])
