"""`raytrainer launch [OPTIONS] SCRIPT [SCRIPT ARGS]`: the script on N Ray workers, as torchrun would run it
(hosting/launch_script.py). The options before SCRIPT are raytrainer's (hosting/options.py's `HostedOptions`,
built from the command line in one step); everything after it is the script's own."""

from __future__ import annotations

import argparse
import json

from ..arguments.scaling import parse_workers
from .storage_args import storage_option, storage_options_of

DESCRIPTION = """\
Run SCRIPT on N Ray workers, as `torchrun --nproc_per_node N SCRIPT ...` would: every rank runs it, with
RANK, WORLD_SIZE and LOCAL_RANK set and the process group up. Every transformers.Trainer it builds (TRL's
SFTTrainer, Seq2SeqTrainer, your own subclass) commits its checkpoints to its output_dir (a local path or an
fsspec URL such as s3://...), resumes from the newest one when the run restarts after a lost worker or when
the same command runs again (--fresh starts over), and reports progress and logs to this console.

Ray: RAY_ADDRESS or --ray_address joins a cluster; without one, a local Ray starts here. Under
`ray job submit -- raytrainer launch ...` the job's cluster is used."""

EPILOG = """\
examples:
  raytrainer launch --num_workers 2 train_sft.py --output_dir runs/sft --max_steps 100
  raytrainer launch --num_workers 2-4 --max_failures 3 train.py --output_dir s3://bucket/runs/sft
  raytrainer launch --num_workers 2 --storage_options endpoint_url=http://127.0.0.1:9000 train.py ..."""


def add_parser(commands) -> argparse.ArgumentParser:
    launch = commands.add_parser("launch", help="run a training script on N Ray workers, as torchrun would",
                                 description=DESCRIPTION, epilog=EPILOG,
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 usage="raytrainer launch [OPTIONS] SCRIPT [SCRIPT ARGS ...]")
    launch.add_argument("--num_workers", type=parse_workers, default=1, metavar="N|MIN-MAX",
                        help="workers (one per GPU, or per CPU slot); MIN-MAX for an elastic run (default 1)")
    launch.add_argument("--max_failures", type=int, metavar="K",
                        help="restarts after a lost worker before the run fails (-1: no limit)")
    launch.add_argument("--max_preemptions", type=int, metavar="K",
                        help="restarts after a preemption (SIGTERM, a node drain) before the run fails")
    launch.add_argument("--storage_options", action="append", type=storage_option, metavar="KEY=VALUE",
                        help="fsspec option for the output_dir URLs (repeatable; dotted keys nest)")
    launch.add_argument("--resources_per_worker", type=json.loads, metavar="JSON", help='e.g. \'{"CPU": 4}\'')
    launch.add_argument("--use_gpu", type=lambda v: v.lower() in ("1", "true", "yes"), metavar="true|false",
                        help="default: the cluster's GPUs, if it has any")
    launch.add_argument("--ray_address", metavar="ADDRESS")
    launch.add_argument("--report_to", nargs="+", metavar="NAME",
                        help="reporters run on this driver (tensorboard, mlflow, wandb, trackio, none; default: the "
                             "script's)")
    launch.add_argument("--logging_dir", metavar="DIR")
    launch.add_argument("--run_name")
    launch.add_argument("--log_level", choices=("debug", "info", "warning", "error", "critical", "passive"))
    launch.add_argument("--worker_idle_timeout_s", type=float)
    launch.add_argument("--ddp_timeout", type=int, metavar="SECONDS")
    launch.add_argument("--hang_warning_s", type=float, metavar="SECONDS",
                        help="name a rank without progress this long (its rank, phase and line; default 300, 0: off)")
    launch.add_argument("--hang_timeout_s", type=float, metavar="SECONDS",
                        help="end a rank without progress this long: the job restarts from its newest committed "
                             "checkpoint, one failure against --max_failures (default 1800, 0: off)")
    launch.add_argument("--disable_tqdm", action="store_true", default=None, help="log lines instead of a bar")
    launch.add_argument("--fresh", action="store_true",
                        help="do not resume: every Trainer starts from step 0 (its output_dir's checkpoints stay)")
    add_torchrun_flags(launch)
    launch.add_argument("script", metavar="SCRIPT", help="the training script, as given to torchrun")
    launch.add_argument("script_args", nargs=argparse.REMAINDER, metavar="SCRIPT ARGS",
                        help="the script's own arguments")
    launch.set_defaults(run=run_launch)
    return launch


# torchrun's own flags, which a user moving from `torchrun ... script.py` types out of habit: each is refused with
# what to write instead (Ray places the workers and makes the process group, so the rendezvous flags have no use).
TORCHRUN_FLAGS = {
    ("--nproc_per_node", "--nproc-per-node"): "use --num_workers N, the workers across the whole Ray cluster "
                                              "(torchrun's --nnodes x --nproc_per_node); Ray places them on the nodes.",
    ("--nnodes",): "Ray places the workers on the cluster's nodes: give --num_workers (their total, or MIN-MAX for "
                   "an elastic run) and run the command once, on any node or against RAY_ADDRESS.",
    ("--node_rank", "--node-rank", "--master_addr", "--master-addr", "--master_port", "--master-port",
     "--rdzv_endpoint", "--rdzv-endpoint", "--rdzv_backend", "--rdzv-backend", "--rdzv_id", "--rdzv-id"):
        "Ray Train makes the process group: drop it, and run the command once (on any node, or against "
        "RAY_ADDRESS) instead of once per node.",
}


class _TorchrunFlag(argparse.Action):
    def __init__(self, option_strings, dest, fix: str = "", **kwargs):
        self.fix = fix
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string} is torchrun's option, not raytrainer launch's: {self.fix}")


def add_torchrun_flags(launch: argparse.ArgumentParser) -> None:
    for names, fix in TORCHRUN_FLAGS.items():
        launch.add_argument(*names, action=_TorchrunFlag, fix=fix, nargs="?", help=argparse.SUPPRESS)
    launch.add_argument("--standalone", action=_TorchrunFlag, nargs=0, help=argparse.SUPPRESS,
                        fix="a local Ray starts by itself when no cluster is named: drop it.")


def run_launch(args: argparse.Namespace) -> int:
    from ..hosting.launch_script import launch_script
    from ..hosting.options import HOST_OPTIONS, hosted_options

    # The options this command has, as given (None: not given, the default holds); --fresh is resume=False.
    given = {name: getattr(args, name, None) for name in HOST_OPTIONS}
    given["storage_options"] = storage_options_of(args.storage_options) if args.storage_options else None
    given = {name: value for name, value in given.items() if value is not None}
    if args.fresh:
        given["resume"] = False
    launch_script(args.script, args.script_args, hosted_options(given, "raytrainer launch"),
                  reporters_named="report_to" in given)
    return 0
