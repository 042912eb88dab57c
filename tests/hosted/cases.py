"""Hosted training cases: an ordinary, self-contained Hugging Face training script.

This file is deliberately written as *client code*, in the shape of the example
scripts that TRL (``trl/scripts/sft.py``, ``dpo.py``, ``reward.py``, ``grpo.py``)
and transformers (``examples/pytorch/summarization/run_summarization.py``, the
Trainer optimizer docs) document.  It imports neither ``raytrainer`` nor
anything from ``tests.``; it only uses torch, transformers, trl, datasets,
tokenizers and safetensors.  Every model is built from a config, the tokenizer
is built in code and every data set is generated in code, so nothing is fetched
from a hub.

Each case builds a fresh tiny model (``torch.manual_seed(0)`` before building),
trains it for ``--max_steps`` steps (default 6, logging every step,
checkpointing every 3 steps to ``{output_root}/{case}``) and then, on rank 0
only (``RANK`` environment variable, default 0), writes

* ``{results_dir}/{case}.json``: ``log_history``, ``global_step`` and
  case-specific extras (``predictions`` for ``seq2seq``; ``wall_time_s``,
  which is informational and not deterministic), and
* ``{results_dir}/{case}.safetensors``: the final, unwrapped state dict.

All ranks then call ``trainer.save_model()``.  After the last case the script
does what TRL's scripts do with ``trainer.end()`` (transformers >= 5.18: finish
the trackers, destroy the process group), but only after it has dropped its
references to the DDP-wrapped model (see the comment at the end of ``main``).

``--output_root`` may be a local directory or a remote URL such as
``s3://bucket/prefix``.  The script never opens or creates anything under it;
it only passes ``output_dir=f"{output_root}/{case}"`` to the training
arguments, so the launcher is responsible for mapping a remote output dir.
``--results_dir`` is always a local directory.

Everything is deterministic: fixed seeds, all dropouts 0.0,
``dataloader_num_workers=0``; GRPO samples its completions from the seeded
generator.  Numbers from different launchers are compared with
``tests/hosted/compare.py``.

The three ways the script is run unmodified:

1. torchrun (CPU, gloo)::

       python -m torch.distributed.run --nproc_per_node 2 tests/hosted/cases.py \\
           --output_root /tmp/casesA --results_dir /tmp/resA \\
           --cases sft,sft_packing,dpo,reward,seq2seq,galore,lomo,grokadamw,grpo

2. raytrainer's launcher, as a script run on 2 Ray workers, with the same
   arguments (``--output_root`` may then be an ``s3://`` URL).

3. one plain process::

       python tests/hosted/cases.py --output_root /tmp/cases1 --results_dir /tmp/res1 \\
           --cases galore_layerwise

   ``galore_layerwise`` (``optim="galore_adamw_layerwise"``) only works in one
   process: transformers refuses layer-wise optimizers under DDP.

Notes on what this needs on CPU with TRL 1.16 / transformers 5.24:

* ``use_cpu=True`` when CUDA is missing.  Without it accelerate does not set up
  gloo DDP under torchrun (``parallel_mode`` stays ``NOT_PARALLEL``): each rank
  trains alone, with world size 1, and only a warning is logged.
* TRL's configs default to ``bf16=True`` and gradient checkpointing on; both are
  turned off here (``bf16=True`` fails on a CPU without ``use_cpu``).
* ``lomo`` uses ``optim="lomo"``: ``optim="adalomo"`` cannot run on CPU,
  because lomo-optim 0.1.1's AdaLomo allocates its state with ``.cuda()``.
  LOMO updates the weights inside backward hooks, before DDP averages the
  gradients, so under DDP each rank applies its own local gradients and the
  ranks' weights drift apart (about 5e-4 after 6 steps here); only rank 0's
  weights are saved.  The runs are still deterministic.

* ``sft_packing`` uses ``packing=True`` with the default ``packing_strategy="bfd"``,
  which turns on padding-free batches (all sequences of a batch flattened into
  one row, with ``position_ids`` restarting at 0 for every sequence and no
  ``attention_mask``).  TRL documents padding-free for FlashAttention, which
  is not available on CPU; the model is instead built with
  ``attn_implementation="sdpa"``, for which transformers' masking utilities
  detect the packed sequences from ``position_ids`` and build a block-diagonal
  causal mask, so sequences do not attend across boundaries.
* ``grpo``: ``generation_batch_size`` (= per_device_train_batch_size *
  world_size * steps_per_generation) must be divisible by ``num_generations``,
  and ``per_device_eval_batch_size * world_size`` must be divisible by
  ``num_generations`` too; with ``num_generations=2`` and batch size 2 both hold
  for one and for two processes.
"""

from __future__ import annotations

import argparse
import json
import os
import posixpath
import random
import time

import numpy as np
import psutil
import torch
from datasets import Dataset
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    DataCollatorForSeq2Seq,
    LlamaConfig,
    PreTrainedTokenizerFast,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
    T5Config,
    T5ForConditionalGeneration,
)
from trl import (
    DPOConfig,
    DPOTrainer,
    GRPOConfig,
    GRPOTrainer,
    RewardConfig,
    RewardTrainer,
    SFTConfig,
    SFTTrainer,
)

ALL_CASES = (
    "sft",
    "sft_packing",
    "dpo",
    "reward",
    "seq2seq",
    "galore",
    "lomo",
    "grokadamw",
    "grpo",
    "galore_layerwise",
)

SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]
WORDS = (
    "apple banana cherry dog egg fish goat house ice jam kite lemon moon nest "
    "orange pen queen rain sun tree umbrella violin water box yarn zebra red "
    "blue green black white big small fast slow hot cold up down left "
    "one two three four five six seven eight nine ten"
).split()
assert len(WORDS) == len(set(WORDS)) == 50, len(WORDS)
REWARD_WORD = "apple"
FIRST_HALF = frozenset(WORDS[: len(WORDS) // 2])


# ---------------------------------------------------------------------------
# Tokenizer, models, data
# ---------------------------------------------------------------------------


def build_tokenizer(append_eos: bool = False) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over WORDS plus the four special tokens.

    With ``append_eos`` the tokenizer appends ``</s>`` to every encoded text
    (like T5's tokenizer does); the decoder-only cases leave that to TRL.
    """
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    if append_eos:
        backend.post_processor = processors.TemplateProcessing(
            single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", vocab["</s>"])]
        )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        unk_token="<unk>",
        padding_side="right",
        model_max_length=64,
    )
    return tokenizer


def llama_config(tokenizer: PreTrainedTokenizerFast, **kwargs) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attention_dropout=0.0,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **kwargs,
    )


def tiny_causal_lm(tokenizer: PreTrainedTokenizerFast):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(llama_config(tokenizer), attn_implementation="sdpa")


def tiny_reward_model(tokenizer: PreTrainedTokenizerFast):
    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_config(
        llama_config(tokenizer, num_labels=1), attn_implementation="sdpa"
    )


def tiny_t5(tokenizer: PreTrainedTokenizerFast) -> T5ForConditionalGeneration:
    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        dropout_rate=0.0,
        classifier_dropout=0.0,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        decoder_start_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(0)
    return T5ForConditionalGeneration(config)


def sentence(rng: random.Random, lo: int = 3, hi: int = 8) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(lo, hi)))


def text_dataset(n: int = 40, seed: int = 1) -> Dataset:
    rng = random.Random(seed)
    return Dataset.from_dict({"text": [sentence(rng) for _ in range(n)]})


def preference_dataset(n: int = 24, seed: int = 2, with_prompt: bool = True) -> Dataset:
    rng = random.Random(seed)
    rows = {"prompt": [], "chosen": [], "rejected": []}
    for _ in range(n):
        prompt = sentence(rng, 2, 4)
        body = sentence(rng, 2, 4).split()
        # "chosen" mentions REWARD_WORD, "rejected" does not.
        chosen = " ".join([REWARD_WORD] + body)
        rejected = " ".join([w for w in body if w != REWARD_WORD] + ["cold"])
        if with_prompt:
            rows["prompt"].append(prompt)
            rows["chosen"].append(" " + chosen)
            rows["rejected"].append(" " + rejected)
        else:
            rows["chosen"].append(prompt + " " + chosen)
            rows["rejected"].append(prompt + " " + rejected)
    if not with_prompt:
        del rows["prompt"]
    return Dataset.from_dict(rows)


def prompt_dataset(n: int, seed: int) -> Dataset:
    rng = random.Random(seed)
    return Dataset.from_dict({"prompt": [sentence(rng, 2, 4) for _ in range(n)]})


def reverse_dataset(n: int, seed: int) -> Dataset:
    rng = random.Random(seed)
    sources, targets = [], []
    for _ in range(n):
        # Small sub-vocabulary and long-ish targets so that a few steps already make
        # the generated ids depend on the input.
        words = [rng.choice(WORDS[:10]) for _ in range(rng.randint(4, 7))]
        sources.append(" ".join(words))
        targets.append(" ".join(reversed(words)))
    return Dataset.from_dict({"source": sources, "target": targets})


# ---------------------------------------------------------------------------
# Common arguments
# ---------------------------------------------------------------------------


def common_args(opts: argparse.Namespace, case: str) -> dict:
    return dict(
        output_dir=posixpath.join(opts.output_root, case),
        max_steps=opts.max_steps,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=1,
        learning_rate=1e-3,
        lr_scheduler_type="linear",
        warmup_steps=0,
        logging_steps=1,
        save_strategy="steps",
        save_steps=3,
        seed=42,
        data_seed=42,
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        # TRL's configs default to bf16=True and gradient (activation) checkpointing on;
        # these cases train in fp32 without checkpointing unless a case asks for it.
        bf16=False,
        activation_checkpointing=False,
        # On a machine without CUDA, accelerate only sets up multi-process (gloo) DDP
        # when told to use the CPU: without use_cpu=True, each torchrun rank
        # silently trains on its own as a single process (world_size 1).
        use_cpu=not torch.cuda.is_available(),
    )


# ---------------------------------------------------------------------------
# Cases: each returns (trainer, extras)
# ---------------------------------------------------------------------------


def _sft(opts, case, **config_kwargs):
    tokenizer = build_tokenizer()
    model = tiny_causal_lm(tokenizer)
    args = SFTConfig(**{**common_args(opts, case), "max_length": 32, **config_kwargs})
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=text_dataset(),
        processing_class=tokenizer,
    )
    trainer.train()
    return trainer, {}


def case_sft(opts, case):
    return _sft(opts, case)


def case_sft_packing(opts, case):
    # packing_strategy="bfd" (default) => padding-free batches; the sdpa model
    # derives a block-diagonal mask from the restarting position_ids.
    return _sft(opts, case, packing=True, packing_strategy="bfd")


# The Trainer docs' GaLore example; rank/update_proj_gap sized to the tiny model.
GALORE = dict(optim_target_modules=[r".*.attn.*", r".*.mlp.*"], optim_args="rank=8, update_proj_gap=2, scale=0.25")


def case_galore(opts, case):
    return _sft(opts, case, optim="galore_adamw", **GALORE)


def case_galore_layerwise(opts, case):
    return _sft(opts, case, optim="galore_adamw_layerwise", **GALORE)


def case_lomo(opts, case):
    # The docs' LOMO example: activation (gradient) checkpointing on; its lr of
    # 2e-6 is too small to move the tiny model, so the common 1e-3 is kept.
    # optim="adalomo" cannot run on CPU: lomo-optim 0.1.1's AdaLomo allocates
    # its state with a hard-coded `.cuda()`.  Plain LOMO has no such call.
    return _sft(opts, case, optim="lomo", activation_checkpointing=True)


def case_grokadamw(opts, case):
    return _sft(opts, case, optim="grokadamw")


def case_dpo(opts, case):
    tokenizer = build_tokenizer()
    model = tiny_causal_lm(tokenizer)
    ref_model = tiny_causal_lm(tokenizer)  # an explicit second copy (same seed, same weights)
    args = DPOConfig(**common_args(opts, case), max_length=32, beta=0.1)
    trainer = DPOTrainer(
        model=model,
        ref_model=ref_model,
        args=args,
        train_dataset=preference_dataset(with_prompt=True),
        processing_class=tokenizer,
    )
    trainer.train()
    return trainer, {}


def case_reward(opts, case):
    tokenizer = build_tokenizer()
    model = tiny_reward_model(tokenizer)
    args = RewardConfig(**common_args(opts, case), max_length=32)
    trainer = RewardTrainer(
        model=model,
        args=args,
        train_dataset=preference_dataset(with_prompt=False),
        processing_class=tokenizer,
    )
    trainer.train()
    return trainer, {}


def case_seq2seq(opts, case):
    trainer, test_ds = build_seq2seq(opts, case)
    trainer.train()
    predict_results = trainer.predict(test_ds, metric_key_prefix="test")
    predictions = np.asarray(predict_results.predictions)
    return trainer, {
        "predictions": predictions.tolist(),
        "test_metrics": {k: v for k, v in predict_results.metrics.items()},
    }


def build_seq2seq(opts, case):
    """The Seq2SeqTrainer of the seq2seq case, untrained, and its test set (run_summarization's shape)."""
    tokenizer = build_tokenizer(append_eos=True)
    model = tiny_t5(tokenizer)

    def preprocess(examples):
        model_inputs = tokenizer(examples["source"], max_length=16, truncation=True)
        labels = tokenizer(text_target=examples["target"], max_length=16, truncation=True)
        model_inputs["labels"] = labels["input_ids"]
        return model_inputs

    columns = ["source", "target"]
    train_ds = reverse_dataset(32, seed=3).map(preprocess, batched=True, remove_columns=columns)
    eval_ds = reverse_dataset(8, seed=4).map(preprocess, batched=True, remove_columns=columns)
    test_ds = reverse_dataset(8, seed=5).map(preprocess, batched=True, remove_columns=columns)

    data_collator = DataCollatorForSeq2Seq(tokenizer, model=model, label_pad_token_id=-100)

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        if isinstance(preds, tuple):
            preds = preds[0]
        preds = np.where(preds != -100, preds, tokenizer.pad_token_id)
        labels = np.where(labels != -100, labels, tokenizer.pad_token_id)
        decoded_preds = [p.strip() for p in tokenizer.batch_decode(preds, skip_special_tokens=True)]
        decoded_labels = [t.strip() for t in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        exact = float(np.mean([p == t for p, t in zip(decoded_preds, decoded_labels)]))
        gen_len = float(np.mean([np.count_nonzero(p != tokenizer.pad_token_id) for p in preds]))
        return {"exact_match": round(exact, 4), "gen_len": round(gen_len, 4)}

    args = Seq2SeqTrainingArguments(
        # T5 from scratch needs a larger lr than the decoder-only cases for greedy
        # generation to leave the pad token within a handful of steps.
        **{**common_args(opts, case), "learning_rate": 1e-2},
        per_device_eval_batch_size=2,
        eval_strategy="steps",
        eval_steps=3,
        predict_with_generate=True,
        generation_max_length=8,
        generation_num_beams=1,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        train_dataset=train_ds,
        eval_dataset=eval_ds,
        data_collator=data_collator,
        processing_class=tokenizer,
        compute_metrics=compute_metrics,
    )
    return trainer, test_ds


def reward_first_half(completions, **kwargs):
    """Toy reward: the fraction of words in the completion from the first half of WORDS."""
    rewards = []
    for completion in completions:
        words = completion.split()
        rewards.append(sum(w in FIRST_HALF for w in words) / len(words) if words else 0.0)
    return rewards


def case_grpo(opts, case):
    tokenizer = build_tokenizer()
    tokenizer.padding_side = "left"  # generation pads prompts on the left
    model = tiny_causal_lm(tokenizer)
    args = GRPOConfig(
        **common_args(opts, case),
        num_generations=2,
        max_completion_length=4,
        per_device_eval_batch_size=2,
        eval_strategy="steps",
        eval_steps=3,
        temperature=1.0,
        beta=0.0,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_first_half,
        args=args,
        train_dataset=prompt_dataset(32, seed=6),
        eval_dataset=prompt_dataset(4, seed=7),
        processing_class=tokenizer,
    )
    trainer.train()
    return trainer, {}


CASES = {name: globals()[f"case_{name}"] for name in ALL_CASES}


# ---------------------------------------------------------------------------
# Results
# ---------------------------------------------------------------------------


def cpu_state_dict(model) -> dict[str, torch.Tensor]:
    # clone() so tied tensors (e.g. T5's shared embeddings) become separate
    # storages, which safetensors requires.
    return {k: v.detach().cpu().clone().contiguous() for k, v in model.state_dict().items()}


def write_results(trainer, case: str, results_dir: str, extras: dict) -> None:
    model = trainer.accelerator.unwrap_model(trainer.model)
    result = {
        "case": case,
        "global_step": trainer.state.global_step,
        "log_history": trainer.state.log_history,
        # compared like any extra: runs at different thread counts may round differently, and a mismatch is
        # named here instead of as a weight that differs in its last digits
        "torch_threads": torch.get_num_threads(),
        **extras,
    }
    with open(os.path.join(results_dir, f"{case}.json"), "w") as f:
        json.dump(result, f, indent=1, sort_keys=True)
    save_file(cpu_state_dict(model), os.path.join(results_dir, f"{case}.safetensors"))


def parse_cases(value: str) -> list[str]:
    cases = [c.strip() for c in value.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown or not cases:
        raise argparse.ArgumentTypeError(f"unknown case(s) {unknown}; choose from {','.join(ALL_CASES)}")
    return cases


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_root", required=True, help="local dir or URL (s3://bucket/prefix)")
    parser.add_argument("--results_dir", required=True, help="local dir for <case>.json/.safetensors")
    parser.add_argument("--cases", required=True, type=parse_cases, help=f"comma list of {','.join(ALL_CASES)}")
    parser.add_argument("--max_steps", type=int, default=6)
    return parser


def main(argv=None) -> None:
    opts = make_parser().parse_args(argv)
    is_rank0 = int(os.environ.get("RANK", "0")) == 0
    if is_rank0:
        os.makedirs(opts.results_dir, exist_ok=True)

    # The first case's wall time counts from the process start, so it includes the imports.
    start = time.perf_counter() - (time.time() - psutil.Process().create_time())
    trainer = None
    for case in opts.cases:
        trainer, extras = CASES[case](opts, case)
        wall = time.perf_counter() - start
        if is_rank0:
            write_results(trainer, case, opts.results_dir, {**extras, "wall_time_s": round(wall, 2)})
        trainer.save_model()
        wall = time.perf_counter() - start
        if is_rank0:
            print(f"[cases] {case}: done in {wall:.1f}s, global_step={trainer.state.global_step}", flush=True)
        start = time.perf_counter()

    if trainer is not None:
        # TRL's scripts end with `trainer.end()` (transformers >= 5.18: finish the
        # trackers and destroy the process group).  Here the Trainer and accelerate's
        # references to the DDP-wrapped model are dropped first: with gloo (torch
        # 2.13), destroying the group while a DDP Reducer still holds it lets the
        # group's destructor run later from the Reducer's dealloc with the GIL held,
        # and that intermittently deadlocks against gloo's worker thread at exit.
        accelerator = trainer.accelerator
        del trainer
        accelerator.free_memory()  # releases the prepared model/optimizer and runs gc
        accelerator.end_training()  # what trainer.end() does


if __name__ == "__main__":
    main()
