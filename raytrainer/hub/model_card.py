"""`Trainer.create_model_card(...)`: the draft model card (README.md) transformers writes at the end of its example
scripts, with its signature, written through fsspec so an `s3://` output_dir gets one too.

The card has transformers' layout: YAML metadata (tags with `generated_from_trainer`, base_model, datasets,
the last evaluation as model-index results), the evaluation summary, the hyperparameters (with the total
batch over the workers) and the training-results table from `state.log_history`.
"""

from __future__ import annotations

import os
import platform
from typing import Any, Dict, List, Optional, Union

import yaml

from ..storage import exists, join, read_text, write_text

CARD_NAME = "README.md"
TAG = "generated_from_trainer"
# Logged with each evaluation but not results (transformers leaves them out of the card too).
_NOT_METRICS = ("runtime", "samples_per_second", "steps_per_second", "epoch", "step")


def _is_metric(key: str) -> bool:
    return key.startswith("eval_") and not key.endswith(_NOT_METRICS) and "_mem_" not in key


def _as_list(value: Union[str, List[str], None]) -> List[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else list(value)


def _existing_metadata(url: str, opts: Optional[dict]) -> Dict[str, Any]:
    """The YAML front matter of a card already there (its tags are kept, as transformers does)."""
    if not exists(url, opts):
        return {}
    text = read_text(url, opts)
    if not text.startswith("---"):
        return {}
    try:
        return yaml.safe_load(text.split("---", 2)[1]) or {}
    except yaml.YAMLError:
        return {}


def _pretty(key: str) -> str:
    return " ".join(part.capitalize() for part in key.split("_"))


def _evaluation(log_history: List[dict]) -> Dict[str, Any]:
    """The last evaluation's metrics, without the eval_ prefix and timing entries."""
    last = next((h for h in reversed(log_history) if any(_is_metric(k) for k in h)), None)
    if last is None:
        return {}
    return {k[len("eval_"):]: v for k, v in last.items() if _is_metric(k)}


def _results_table(log_history: List[dict]) -> List[str]:
    """transformers' 'Training results' table: a row per evaluation, with the last training loss before it."""
    rows, train_loss = [], "No log"
    for entry in log_history:
        if "loss" in entry:
            train_loss = entry["loss"]
        elif any(_is_metric(k) for k in entry):
            metrics = {k: v for k, v in entry.items() if _is_metric(k)}
            row = {"Training Loss": train_loss, "Epoch": entry.get("epoch"), "Step": entry.get("step")}
            row.update({("Validation Loss" if k == "eval_loss" else _pretty(k[5:])): v for k, v in metrics.items()})
            rows.append(row)
    if not rows:
        return []
    columns = list(dict.fromkeys(c for row in rows for c in row))
    fmt = lambda v: f"{v:.4f}" if isinstance(v, float) else ("" if v is None else str(v))  # noqa: E731
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(":---:" for _ in columns) + "|"]
    lines += ["| " + " | ".join(fmt(row.get(c)) for c in columns) + " |" for row in rows]
    return lines


def _hyperparameters(trainer) -> Dict[str, Any]:
    args = trainer.args
    workers = max(args.max_workers, 1)
    found = {"learning_rate": args.learning_rate, "train_batch_size": args.per_device_train_batch_size,
             "eval_batch_size": args.per_device_eval_batch_size, "seed": args.seed}
    if workers > 1:
        found["distributed_type"] = f"ray ({args.strategy}, {workers} workers)"
        found["num_devices"] = workers
    if args.gradient_accumulation_steps > 1:
        found["gradient_accumulation_steps"] = args.gradient_accumulation_steps
    total = args.per_device_train_batch_size * workers * args.gradient_accumulation_steps
    if total != args.per_device_train_batch_size:
        found["total_train_batch_size"] = total
    found["optimizer"] = f"Use {args.optim}" + (f" with betas=({args.adam_beta1},{args.adam_beta2}) and epsilon="
                                                f"{args.adam_epsilon}" if "adam" in args.optim else "")
    found["lr_scheduler_type"] = args.lr_scheduler_type
    if getattr(args, "warmup_steps", 0):
        found["lr_scheduler_warmup_steps"] = args.warmup_steps
    if args.max_steps > 0:
        found["training_steps"] = args.max_steps
    else:
        found["num_epochs"] = args.num_train_epochs
    if args.fp16 or args.bf16:
        found["mixed_precision_training"] = "bf16" if args.bf16 else "Native AMP"
    return found


def _versions() -> List[str]:
    import ray
    import torch

    from .. import __version__

    lines = [f"- raytrainer {__version__}", f"- Ray {ray.__version__}", f"- Pytorch {torch.__version__}"]
    for name, label in (("transformers", "Transformers"), ("datasets", "Datasets"), ("tokenizers", "Tokenizers")):
        try:
            module = __import__(name)
            lines.append(f"- {label} {module.__version__}")
        except ImportError:
            pass
    lines.append(f"- Python {platform.python_version()}")
    return lines


def model_card(trainer, language=None, license=None, tags=None, model_name=None, finetuned_from=None, tasks=None,
               dataset_tags=None, dataset=None, dataset_args=None, existing: Optional[dict] = None) -> str:
    """The card's text (transformers' TrainingSummary, from this trainer's arguments and log history)."""
    args = trainer.args
    config = getattr(trainer.model, "config", None)
    if finetuned_from is None:  # a Hub name, not a local folder the model was loaded from
        name = getattr(config, "_name_or_path", None) or None
        finetuned_from = name if name and not os.path.isdir(name) else None
    model_name = model_name or args.output_dir.rstrip("/").rsplit("/", 1)[-1] or finetuned_from or "model"
    tags = _as_list(tags)
    for tag in [TAG, *((existing or {}).get("tags") or [])]:
        if tag not in tags:
            tags.append(tag)
    datasets = _as_list(dataset) or _as_list(dataset_tags)
    evaluation = _evaluation(trainer.state.log_history)

    metadata: Dict[str, Any] = {"library_name": "transformers" if config is not None else "pytorch"}
    if license:
        metadata["license"] = license
    if finetuned_from:
        metadata["base_model"] = finetuned_from
    if language:
        metadata["language"] = language
    metadata["tags"] = tags
    if datasets:
        metadata["datasets"] = datasets
    task_list = _as_list(tasks)
    if evaluation:
        result = {"metrics": [{"name": _pretty(k), "type": k, "value": v} for k, v in evaluation.items()
                              if isinstance(v, (int, float))]}
        if task_list:
            result["task"] = {"type": task_list[0], "name": _pretty(task_list[0])}
        if datasets:
            result["dataset"] = {"name": datasets[0], "type": datasets[0],
                                 **({"args": _as_list(dataset_args)[0]} if dataset_args else {})}
        metadata["model-index"] = [{"name": model_name, "results": [result]}]
    else:
        metadata["model-index"] = [{"name": model_name, "results": []}]

    on = f" on the {', '.join(datasets)} dataset" if datasets else " on an unknown dataset"
    intro = (f"This model is a fine-tuned version of [{finetuned_from}](https://huggingface.co/{finetuned_from})"
             if finetuned_from else "This model was trained from scratch") + on + "."
    lines = ["---", yaml.safe_dump(metadata, sort_keys=False, allow_unicode=True).rstrip(), "---", "",
             "<!-- This model card has been generated automatically according to the information the Trainer had "
             "access to. You should probably proofread and complete it, then remove this comment. -->", "",
             f"# {model_name}", "", intro]
    if evaluation:
        lines += ["It achieves the following results on the evaluation set:"]
        lines += [f"- {_pretty(k)}: {v:.4f}" if isinstance(v, float) else f"- {_pretty(k)}: {v}"
                  for k, v in evaluation.items()]
    lines += ["", "## Model description", "", "More information needed", "", "## Intended uses & limitations", "",
              "More information needed", "", "## Training and evaluation data", "", "More information needed", "",
              "## Training procedure", "", "Trained with raytrainer on Ray.", "", "### Training hyperparameters", "",
              "The following hyperparameters were used during training:"]
    lines += [f"- {k}: {v}" for k, v in _hyperparameters(trainer).items()]
    table = _results_table(trainer.state.log_history)
    if table:
        lines += ["", "### Training results", "", *table]
    lines += ["", "### Framework versions", "", *_versions(), ""]
    return "\n".join(lines)


class ModelCardMixin:
    def create_model_card(self, language: Optional[str] = None, license: Optional[str] = None,
                          tags: Union[str, List[str], None] = None, model_name: Optional[str] = None,
                          finetuned_from: Optional[str] = None, tasks: Union[str, List[str], None] = None,
                          dataset_tags: Union[str, List[str], None] = None,
                          dataset: Union[str, List[str], None] = None,
                          dataset_args: Union[str, List[str], None] = None) -> None:
        """Write a draft model card, README.md, into output_dir (local or any fsspec URL). On the driver, or
        rank 0 of the workers; the tags of a card already there are kept."""
        if not self.is_world_process_zero():
            return
        opts = self.args.storage_options
        url = join(self.args.output_dir, CARD_NAME)
        text = model_card(self, language=language, license=license, tags=tags, model_name=model_name,
                          finetuned_from=finetuned_from, tasks=tasks, dataset_tags=dataset_tags, dataset=dataset,
                          dataset_args=dataset_args, existing=_existing_metadata(url, opts))
        write_text(url, text, opts)
