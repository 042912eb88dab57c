"""The `raytrainer` command. Subcommands are argparse subparsers, each with its own `run` function.

`raytrainer checkpoints OUTPUT_DIR` shows what a run directory (local or any fsspec URL) holds.
`raytrainer consolidate CHECKPOINT [OUT]` writes a sharded (FSDP) checkpoint's model as model.safetensors.
Errors about storage or configuration print their message and exit 2, without a traceback.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from .errors import ConfigError

# A one-line summary: evaluation metrics first, then the training ones; runtimes and throughput are noise.
_TRAIN_METRICS = ("loss", "learning_rate", "epoch")
_METRIC_NOISE = ("_runtime", "_per_second")
_MAX_METRICS = 4


def _storage_option(text: str) -> tuple[list[str], object]:
    """KEY=VALUE; a dotted KEY nests (client_kwargs.region_name=...); a JSON object/list/bool is decoded.

    Numbers stay strings on purpose: an access key id made of digits must not become an int.
    """
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    if value[:1] in ("{", "[") or value in ("true", "false", "null"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"{key}: invalid JSON value ({exc.msg})") from None
    return key.split("."), value


def _options(pairs: list) -> dict | None:
    options: dict = {}
    for keys, value in pairs or []:
        node = options
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    return options or None


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
    from .checkpoint.listing import list_checkpoints
    from .checkpoint.storage import describe_error

    options = _options(args.storage_option)
    try:
        infos = list_checkpoints(args.output_dir, options)
    except Exception as exc:
        if not _is_storage_failure(exc):
            raise
        raise describe_error(args.output_dir, exc, options) from None
    if args.json:
        print(json.dumps([dataclasses.asdict(info) for info in infos], indent=2, default=str))
        return 0
    if not infos:
        print(f"No checkpoints under {args.output_dir}")
        return 0
    rows = [["STEP", "STATE", "SIZE", "METRICS", "MARKERS"]]
    for info in infos:
        markers = " ".join(m for m, on in (("best", info.best), ("newest", info.newest)) if on)
        rows.append([str(info.step), "committed" if info.committed else "partial", human_size(info.size_bytes),
                     compact_metrics(info.metrics), markers])
    print(f"{args.output_dir}\n{_table(rows)}")
    return 0


def run_consolidate(args: argparse.Namespace) -> int:
    from .checkpoint.consolidate import consolidate

    print(consolidate(args.checkpoint, args.out, _options(args.storage_option)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raytrainer", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    checkpoints = commands.add_parser("checkpoints", help="list the checkpoints of a run directory",
                                      description="List checkpoint-<step> directories: committed or partial, "
                                                  "size, last metrics, and which is best / newest.")
    checkpoints.add_argument("output_dir", metavar="OUTPUT_DIR", help="run directory: a local path or fsspec URL")
    checkpoints.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    checkpoints.add_argument("--storage-option", action="append", type=_storage_option, metavar="KEY=VALUE",
                             help="fsspec option for OUTPUT_DIR, e.g. endpoint_url=http://127.0.0.1:9000 "
                                  "(repeatable; dotted keys nest, JSON objects are decoded)")
    checkpoints.set_defaults(run=run_checkpoints)

    consolidate = commands.add_parser("consolidate", help="write a sharded (FSDP) checkpoint's model as "
                                      "model.safetensors", description="Read the shards of an FSDP checkpoint "
                                      "one tensor at a time and write model.safetensors (and config.json) to OUT.")
    consolidate.add_argument("checkpoint", metavar="CHECKPOINT", help="a committed checkpoint-<step> directory")
    consolidate.add_argument("out", metavar="OUT", nargs="?", help="where to write (default: CHECKPOINT itself)")
    consolidate.add_argument("--storage-option", action="append", type=_storage_option, metavar="KEY=VALUE",
                             help="fsspec option for CHECKPOINT and OUT (repeatable, as for `checkpoints`)")
    consolidate.set_defaults(run=run_consolidate)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except ConfigError as exc:  # StorageError included: its message already names the fix
        print(f"raytrainer: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
