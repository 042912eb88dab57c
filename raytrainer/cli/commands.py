"""The `raytrainer` command: train from a YAML config, list a run's checkpoints.

`raytrainer train CONFIG.yaml [--key value ...]` trains the model and datasets a config names as
`module:function` references; `raytrainer checkpoints OUTPUT_DIR` shows what a run directory (local or any
fsspec URL) holds; `raytrainer consolidate CHECKPOINT [OUT]` writes a sharded (FSDP) checkpoint's model as
model.safetensors. Subcommands are argparse subparsers, each with its own `run` function. Errors about storage
or configuration print their message and exit 2, without a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

from ..errors import ConfigError
from .storage_args import storage_option, storage_options_of

# A one-line summary: evaluation metrics first, then the training ones; runtimes and throughput are noise.
_TRAIN_METRICS = ("loss", "learning_rate", "epoch")
_METRIC_NOISE = ("_runtime", "_per_second")
_MAX_METRICS = 4


def human_size(size: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def compact_metrics(metrics: dict) -> str:
    evals = sorted((k for k in metrics if k.startswith("eval_") and not any(n in k for n in _METRIC_NOISE)),
                   key=lambda k: (k != "eval_loss", k))
    keys = evals + [k for k in _TRAIN_METRICS if k in metrics]
    values = [(k, metrics[k]) for k in keys[:_MAX_METRICS]]
    return " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)


def _is_storage_failure(exc: Exception) -> bool:
    # s3fs turns most S3 errors into OSError; connection failures arrive as botocore / aiohttp exceptions.
    return isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in ("botocore", "aiobotocore", "aiohttp")


def run_checkpoints(args: argparse.Namespace) -> int:
    # Imported here, not at the top: `raytrainer --help` and other subcommands stay instant.
    from ..checkpoint.listing import list_checkpoints
    from ..storage import describe_error

    options = storage_options_of(args.storage_option)
    try:
        infos = list_checkpoints(args.output_dir, options, checksums=args.verify)
    except Exception as exc:
        if not _is_storage_failure(exc):
            raise
        raise describe_error(args.output_dir, exc, options) from None
    # A script (or a CI step) that checks a run's checkpoints reads damage from the exit status: 1.
    damaged = [info for info in infos if info.damaged]
    if args.json:
        print(json.dumps([dataclasses.asdict(info) for info in infos], indent=2, default=str))
        return 1 if damaged else 0
    if not infos:
        print(f"No checkpoints under {args.output_dir}")
        return 0
    rows = [["STEP", "STATE", "SIZE", "METRICS", "MARKERS"]]
    for info in infos:
        markers = " ".join(m for m, on in (("best", info.best), ("newest", info.newest)) if on)
        state = "committed" if info.committed else f"damaged ({info.damaged})" if info.damaged else "partial"
        rows.append([str(info.step), state, human_size(info.size_bytes), compact_metrics(info.metrics), markers])
    print(f"{args.output_dir}\n{_table(rows)}")
    if damaged:
        steps = ", ".join(str(info.step) for info in damaged)
        print(f"{len(damaged)} damaged checkpoint(s) (step {steps}): a resume passes over them to the newest intact "
              "one.", file=sys.stderr)
        return 1
    return 0


TRAIN_DESCRIPTION = """\
Train the model and datasets that CONFIG names, with the TrainingArguments it holds; options after CONFIG
override the file (--max_steps 20, --output_dir s3://bucket/run). Runs unchanged under `ray job submit`.

CONFIG is YAML (or JSON): TrainingArguments fields, plus references `package.module:function` that are
imported from the current directory (or PYTHONPATH) before any Ray worker starts:

  model: examples.tiny_lm:model               # called; returns the torch.nn.Module (or model_init: ...)
  train_dataset:                              # called with kwargs, when given as a mapping
    ref: examples.tiny_lm:train_dataset
    kwargs: {block_size: 64}
  eval_dataset: examples.tiny_lm:eval_dataset           # optional, called
  compute_metrics: examples.tiny_lm:next_byte_accuracy  # optional, handed to the Trainer as it is
  # also optional: data_collator, preprocess_logits_for_metrics, trainer_class (a Trainer subclass)
  output_dir: s3://bucket/runs/tiny_lm
  num_workers: 2
  max_steps: 300

Afterwards the model is saved to output_dir and train metrics to output_dir/train_results.json.

examples:
  raytrainer train examples/configs/tiny_lm.yaml --num_workers 0 --max_steps 20
  RAY_AUTH_MODE=token ray job submit --address http://HEAD:8265 --working-dir . -- \\
      raytrainer train examples/configs/tiny_lm.yaml --output_dir s3://bucket/runs/tiny_lm"""


class _TrainHelp(argparse.Action):
    """`raytrainer train --help`: the config format, then every option (built only when asked: it imports torch)."""

    def __init__(self, option_strings, dest, **kwargs):
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help="show this help and exit")

    def __call__(self, parser, namespace, values, option_string=None):
        parser.print_help()
        print("\noptions that override CONFIG (every TrainingArguments field, and the references):")
        options = _train_options_parser().format_help()
        print(options[options.index("\n\n") + 2:] if "\n\n" in options else options)
        parser.exit()


def _train_options_parser():
    from ..arguments.parser import ArgumentParser
    from ..arguments.training_args import TrainingArguments
    from .config_refs import TrainReferences

    return ArgumentParser([TrainingArguments, TrainReferences], prog="raytrainer train CONFIG", add_help=False)


def run_train(args: argparse.Namespace) -> int:
    from ..arguments.parser import CONFIG_SUFFIXES
    from .config_refs import resolve

    config = args.config
    if {"-h", "--help"} & set(args.overrides):  # `raytrainer train CONFIG --help`: REMAINDER swallowed it
        _TrainHelp(["--help"], "help")(args.train_parser, args, None)
    if not config.lower().endswith(CONFIG_SUFFIXES):
        raise ConfigError(f"CONFIG={config!r}: expected a {'/'.join(CONFIG_SUFFIXES)} file (see raytrainer train "
                          "--help for its format).")
    if not os.path.isfile(config):
        raise ConfigError(f"CONFIG={config!r}: no such file (relative paths start at {os.getcwd()}).")
    training_args, refs = _train_options_parser().parse_args_into_dataclasses([config, *args.overrides])
    if refs.train_dataset is None:
        raise ConfigError(f"{config}: no train_dataset: add `train_dataset: package.module:function` (a function "
                          "that returns the dataset).")
    trainer_class, trainer_kwargs = resolve(refs)  # imports everything before any Ray worker starts
    trainer = trainer_class(args=training_args, **trainer_kwargs)
    output = trainer.train()
    trainer.save_model()
    trainer.log_metrics("train", output.metrics)
    trainer.save_metrics("train", output.metrics)
    trainer.save_state()
    print(f"trained {output.global_step} steps; model and train_results.json in {training_args.output_dir} "
          f"(checkpoints: raytrainer checkpoints {training_args.output_dir})")
    return 0


def run_consolidate(args: argparse.Namespace) -> int:
    from ..checkpoint.consolidate import consolidate

    print(consolidate(args.checkpoint, args.out, storage_options_of(args.storage_option)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="raytrainer", description=__doc__.split("\n\n")[0].replace("\n", " "),
        epilog="`raytrainer COMMAND --help` describes each command.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    train = commands.add_parser("train", help="train what a YAML config names (module:function references)",
                                description=TRAIN_DESCRIPTION, add_help=False,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                usage="raytrainer train CONFIG.yaml [--key value ...]")
    train.add_argument("-h", "--help", action=_TrainHelp)
    train.add_argument("config", metavar="CONFIG", help="YAML/JSON file: TrainingArguments and references")
    train.add_argument("overrides", nargs=argparse.REMAINDER, metavar="--key value",
                       help="TrainingArguments fields or references that override CONFIG")
    train.set_defaults(run=run_train, train_parser=train)

    checkpoints = commands.add_parser(
        "checkpoints", help="list the checkpoints of a run directory",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="List checkpoint-<step> directories: committed, damaged (committed, but a file is missing or "
                    "changed:\nnever used for resume, never deleted) or partial (no valid COMMITTED manifest: never "
                    "used for resume),\nsize, the metrics logged at that step, and which is best / newest.",
        epilog="examples:\n  raytrainer checkpoints runs/quickstart\n"
               "  raytrainer checkpoints s3://bucket/runs/gpt --storage-option endpoint_url=http://127.0.0.1:9000\n"
               "  raytrainer checkpoints s3://bucket/runs/gpt --json | jq '.[] | select(.committed) | .url'\n\n"
               "S3 credentials come from --storage-option key=... secret=... or the AWS_* environment variables.")
    checkpoints.add_argument("output_dir", metavar="OUTPUT_DIR", help="run directory: a local path or fsspec URL")
    checkpoints.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    checkpoints.add_argument("--verify", action="store_true",
                             help="read every committed checkpoint's files against their checksums (same-size "
                                  "damage); without it, sizes only. The exit status is 1 when any is damaged")
    checkpoints.add_argument("--storage-option", action="append", type=storage_option, metavar="KEY=VALUE",
                             help="fsspec option for OUTPUT_DIR, e.g. endpoint_url=http://127.0.0.1:9000 "
                                  "(repeatable; dotted keys nest, JSON objects are decoded)")
    checkpoints.set_defaults(run=run_checkpoints)

    consolidate = commands.add_parser("consolidate", help="write a sharded (FSDP) checkpoint's model as "
                                      "model.safetensors", description="Read the shards of an FSDP checkpoint "
                                      "one tensor at a time and write model.safetensors (and config.json) to OUT.")
    consolidate.add_argument("checkpoint", metavar="CHECKPOINT", help="a committed checkpoint-<step> directory")
    consolidate.add_argument("out", metavar="OUT", nargs="?", help="where to write (default: CHECKPOINT itself)")
    consolidate.add_argument("--storage-option", action="append", type=storage_option, metavar="KEY=VALUE",
                             help="fsspec option for CHECKPOINT and OUT (repeatable, as for `checkpoints`)")
    consolidate.set_defaults(run=run_consolidate)

    from .launch import add_parser as add_launch

    add_launch(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as exc:  # StorageError included: its message already names the fix
        print(f"raytrainer: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the line saying what was kept is printed where the interrupt was taken
        return 130

