"""The plain `transformers.Trainer` script that benchmarks/gpu.py times under torchrun and under `raytrainer launch`:
a Llama built from a config, random token rows made in code (a torch Dataset: the GPU machine has no HF
`datasets`), bf16 on a GPU. It knows nothing of raytrainer. `--fsdp`: HF's own `fsdp="full_shard"` (accelerate's
FSDP; GPU only). `--stamps FILE`: rank 0 writes the wall-clock times of the script's start, of train begin and of
every step end (hosted_sft.py's format)."""

from __future__ import annotations

import time

STARTED = time.time()  # before the imports: under either launcher, what the script itself costs

import argparse  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
import types  # noqa: E402

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import make_step_stamps_callback  # noqa: E402
from fsdp import TokenRows  # noqa: E402  (random token rows, generated per index from the seed)

SIZES = {  # name: (LlamaConfig fields, sequence length, batch per process)
    "gpu": (dict(vocab_size=32000, hidden_size=768, intermediate_size=2048, num_hidden_layers=6,
                 num_attention_heads=12, num_key_value_heads=4), 512, 8),
    "smoke": (dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2), 32, 4),
}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--max_steps", type=int, default=100)
    parser.add_argument("--size", choices=sorted(SIZES), default="gpu")
    parser.add_argument("--fsdp", action="store_true")
    parser.add_argument("--stamps", default="")
    options = parser.parse_args()
    fields, seq, batch = SIZES[options.size]
    gpu = torch.cuda.is_available()
    rows = TokenRows(types.SimpleNamespace(samples=options.max_steps * batch * 8, seq=seq, vocab=fields["vocab_size"],
                                           seed=42))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**fields, max_position_embeddings=seq, use_cache=False,
                                         attn_implementation="sdpa"))
    fsdp = dict(fsdp="full_shard", fsdp_config={"transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}) \
        if options.fsdp else {}
    args = TrainingArguments(output_dir=options.output_dir, max_steps=options.max_steps,
                             per_device_train_batch_size=batch, logging_steps=10, save_strategy="no",
                             report_to="none", disable_tqdm=True, learning_rate=3e-4, seed=42, use_cpu=not gpu,
                             bf16=gpu, dataloader_num_workers=0, **fsdp)
    stamps = make_step_stamps_callback(options.stamps, STARTED)
    Trainer(model=model, args=args, train_dataset=rows, callbacks=[stamps]).train()


if __name__ == "__main__":
    main()
