"""Supervised fine-tuning with TRL's SFTTrainer: an ordinary TRL script, with no raytrainer in it.

A tiny Llama is built from a config, its word-level tokenizer is built in code with the `tokenizers` library,
and the training text is generated in code, so nothing is downloaded. The script is written as for torchrun
and runs unchanged three ways (docs/hosted.md):

    python examples/hosted_sft.py --output_dir /tmp/sft                                    # one process
    torchrun --nproc_per_node 2 examples/hosted_sft.py --output_dir /tmp/sft               # 2 processes
    raytrainer launch --num_workers 2 examples/hosted_sft.py --output_dir /tmp/sft         # 2 Ray workers

Under `raytrainer launch`, `--output_dir` may be an `s3://` URL, the checkpoints are committed there, and the
same command run again continues from the newest one. Every `SFTConfig` field is an option
(`--learning_rate 1e-3`, `--save_steps 10`, ...); the defaults below train 20 steps in seconds on a CPU.
"""

import random
from dataclasses import dataclass, field

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, HfArgumentParser, LlamaConfig, PreTrainedTokenizerFast, set_seed
from trl import SFTConfig, SFTTrainer

WORDS = ("the a one two three red blue green big small cat dog bird fish tree house river hill sun moon "
         "runs sleeps sings swims sees finds likes and but then near under over here there today").split()


@dataclass
class ScriptArguments:
    num_samples: int = field(default=256, metadata={"help": "Generated training sentences."})
    hidden_size: int = field(default=64, metadata={"help": "The tiny Llama's hidden size."})


def build_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {token: i for i, token in enumerate(["<pad>", "<s>", "</s>", "<unk>", *WORDS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", model_max_length=64)


def build_dataset(num_samples: int, seed: int = 0) -> Dataset:
    """Sentences of a small grammar: "the big dog sees a red fish near the river", ..."""
    rng = random.Random(seed)

    def phrase():
        return f"{rng.choice(['the', 'a'])} {rng.choice(['big', 'small', 'red', 'blue'])} " \
               f"{rng.choice(['cat', 'dog', 'bird', 'fish'])}"

    text = [f"{phrase()} {rng.choice(['sees', 'finds', 'likes'])} {phrase()} "
            f"{rng.choice(['near', 'under', 'over'])} the {rng.choice(['tree', 'house', 'river', 'hill'])}"
            for _ in range(num_samples)]
    return Dataset.from_dict({"text": text})


def build_parser() -> HfArgumentParser:
    parser = HfArgumentParser((ScriptArguments, SFTConfig))
    parser.set_defaults(output_dir="runs/hosted_sft", max_steps=20, per_device_train_batch_size=8,
                        learning_rate=3e-3, logging_steps=5, save_steps=10, save_total_limit=2, max_length=32,
                        # No CUDA: accelerate sets up a multi-process (gloo) run only when told to use the CPU
                        # (without it each torchrun rank trains alone), and SFTConfig's default bf16=True
                        # needs it too.
                        use_cpu=not torch.cuda.is_available())
    return parser


def main():
    parser = build_parser()
    script_args, training_args = parser.parse_args_into_dataclasses()

    set_seed(training_args.seed)  # the same initial weights on every rank and in every way of running
    tokenizer = build_tokenizer()
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=script_args.hidden_size,
                         intermediate_size=2 * script_args.hidden_size, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    model = AutoModelForCausalLM.from_config(config)

    trainer = SFTTrainer(model=model, args=training_args, train_dataset=build_dataset(script_args.num_samples),
                         processing_class=tokenizer)
    trainer.train(resume_from_checkpoint=training_args.resume_from_checkpoint)
    trainer.save_model()  # into output_dir (under `raytrainer launch`, an s3:// output_dir too)


if __name__ == "__main__":
    main()
