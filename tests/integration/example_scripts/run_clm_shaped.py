"""A causal-LM fine-tuning script in the shape of transformers' `examples/pytorch/language-modeling/run_clm.py`
(written here, not copied): dataclass arguments parsed by transformers' own `HfArgumentParser`, `--do_train /
--do_eval`, a resume found by transformers' `get_last_checkpoint`, `main_process_first()` around the map,
`default_data_collator`, an `evaluate` metric loaded from a local folder, and the log_metrics / save_metrics /
save_state / create_model_card ending. The only raytrainer line is the import of Trainer and TrainingArguments.

    python run_clm_shaped.py --tokenizer_name DIR --train_file F --validation_file F --metric_dir DIR
        --output_dir OUT --do_train --do_eval --num_workers 2 ...
"""

import logging
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Optional

import datasets
import evaluate
import transformers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    HfArgumentParser,
    default_data_collator,
    set_seed,
)
from transformers.trainer_utils import get_last_checkpoint

from raytrainer import Trainer, TrainingArguments

logger = logging.getLogger(__name__)


@dataclass
class ModelArguments:
    tokenizer_name: str = field(metadata={"help": "A tokenizer folder."})
    model_type: str = field(default="gpt2")
    config_overrides: Optional[str] = field(default=None, metadata={"help": "'n_embd=32,n_layer=2'"})


@dataclass
class DataTrainingArguments:
    train_file: str = field(metadata={"help": "A text file, one example a line."})
    validation_file: str = field(metadata={"help": "A text file, one example a line."})
    metric_dir: str = field(metadata={"help": "A folder holding an `evaluate` metric script."})
    block_size: int = field(default=16)
    max_eval_samples: Optional[int] = field(default=None)


def main():
    parser = HfArgumentParser((ModelArguments, DataTrainingArguments, TrainingArguments))
    model_args, data_args, training_args = parser.parse_args_into_dataclasses()

    logging.basicConfig(format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
                        handlers=[logging.StreamHandler(sys.stdout)])
    if training_args.should_log:
        transformers.utils.logging.set_verbosity_info()
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    datasets.utils.logging.set_verbosity(log_level)
    transformers.utils.logging.set_verbosity(log_level)
    logger.warning(f"Process rank: {training_args.local_rank}, device: {training_args.device}, n_gpu: "
                   f"{training_args.n_gpu}, distributed training: {training_args.parallel_mode.value == 'distributed'}")

    last_checkpoint = None
    if os.path.isdir(training_args.output_dir) and training_args.do_train:
        last_checkpoint = get_last_checkpoint(training_args.output_dir)
        if last_checkpoint is not None and training_args.resume_from_checkpoint is None:
            logger.info(f"Checkpoint detected, resuming training at {last_checkpoint}.")
    set_seed(training_args.seed)

    raw = datasets.load_dataset("text", data_files={"train": data_args.train_file,
                                                    "validation": data_args.validation_file})
    tokenizer = AutoTokenizer.from_pretrained(model_args.tokenizer_name)
    config = AutoConfig.for_model(model_args.model_type, vocab_size=len(tokenizer), n_positions=64,
                                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    if model_args.config_overrides:
        config.update_from_string(model_args.config_overrides)
    model = AutoModelForCausalLM.from_config(config)

    def tokenize_function(examples):
        return tokenizer(examples["text"])

    def group_texts(examples):
        joined = {k: sum(examples[k], []) for k in examples}
        total = (len(joined["input_ids"]) // data_args.block_size) * data_args.block_size
        result = {k: [t[i:i + data_args.block_size] for i in range(0, total, data_args.block_size)]
                  for k, t in joined.items()}
        result["labels"] = result["input_ids"].copy()
        return result

    with training_args.main_process_first(desc="dataset map tokenization"):
        tokenized = raw.map(tokenize_function, batched=True, remove_columns=["text"])
    with training_args.main_process_first(desc="grouping texts together"):
        lm_datasets = tokenized.map(group_texts, batched=True)
    train_dataset, eval_dataset = lm_datasets["train"], lm_datasets["validation"]
    if data_args.max_eval_samples is not None:
        eval_dataset = eval_dataset.select(range(min(len(eval_dataset), data_args.max_eval_samples)))

    metric = evaluate.load(data_args.metric_dir)

    def preprocess_logits_for_metrics(logits, labels):
        if isinstance(logits, tuple):
            logits = logits[0]
        return logits.argmax(dim=-1)

    def compute_metrics(eval_preds):
        preds, labels = eval_preds
        labels = labels[:, 1:].reshape(-1)
        preds = preds[:, :-1].reshape(-1)
        return metric.compute(predictions=preds, references=labels)

    trainer = Trainer(model=model, args=training_args, train_dataset=train_dataset if training_args.do_train else None,
                      eval_dataset=eval_dataset if training_args.do_eval else None, processing_class=tokenizer,
                      data_collator=default_data_collator, compute_metrics=compute_metrics,
                      preprocess_logits_for_metrics=preprocess_logits_for_metrics)

    if training_args.do_train:
        checkpoint = training_args.resume_from_checkpoint or last_checkpoint
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model()
        metrics = train_result.metrics
        metrics["train_samples"] = len(train_dataset)
        trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()

    if training_args.do_eval:
        metrics = trainer.evaluate()
        metrics["eval_samples"] = len(eval_dataset)
        metrics["perplexity"] = math.exp(metrics["eval_loss"])
        trainer.log_metrics("eval", metrics)
        trainer.save_metrics("eval", metrics)

    kwargs = {"finetuned_from": model_args.model_type, "tasks": "text-generation"}
    if training_args.push_to_hub:
        trainer.push_to_hub(**kwargs)
    else:
        trainer.create_model_card(**kwargs)


if __name__ == "__main__":
    main()
