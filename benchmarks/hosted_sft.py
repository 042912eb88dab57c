"""The SFT script that benchmarks/hosted.py times: TRL's SFTTrainer as its docs show it, on a small Llama built
from a config, a tokenizer and rows made in code. It knows nothing of raytrainer: the benchmark runs it under
torchrun and under `raytrainer launch`. `--stamps FILE`: rank 0 writes the wall-clock times of the script's
start, of train begin and of every step end."""

from __future__ import annotations

import time

STARTED = time.time()  # before the imports: under either launcher, what the script itself costs

import os  # noqa: E402
import random  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import make_step_stamps_callback, timed_script_parser  # noqa: E402

WORDS = [f"w{i}" for i in range(200)]


def main():
    options = timed_script_parser().parse_args()
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>"] + WORDS)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                        unk_token="<unk>")
    rng = random.Random(0)
    rows = [{"text": " ".join(rng.choice(WORDS) for _ in range(rng.randint(24, 60)))} for _ in range(512)]
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(vocab), hidden_size=128, intermediate_size=256,
                                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=128, pad_token_id=0, bos_token_id=1, eos_token_id=2))
    args = SFTConfig(output_dir=options.output_dir, max_steps=options.max_steps, per_device_train_batch_size=4,
                     max_length=64, logging_steps=10, save_strategy="no", report_to="none", disable_tqdm=True,
                     learning_rate=1e-3, seed=42, use_cpu=not torch.cuda.is_available(),
                     bf16=torch.cuda.is_available())
    trainer = SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tokenizer,
                         callbacks=[make_step_stamps_callback(options.stamps, STARTED)])
    trainer.train()


if __name__ == "__main__":
    main()
