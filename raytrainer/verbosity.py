"""A quiet console by default: the progress bar, the logs and the results; Ray's and the libraries' own
chatter lowered. One switch brings everything back: `log_level="debug"` or `RAYTRAINER_VERBOSE=1`.

What is lowered, and where:
- driver: Ray's token-authentication notice (token authentication itself stays on), MLflow's set-up lines,
  Ray Data's execution plans and progress lines (and those of its SplitCoordinator actor);
- Ray Train's controller and worker lines (resource requests, worker-group start, process-group set-up):
  WARNING through Ray Train's own `LoggingConfig` in the run's `RunConfig`;
- lines Ray forwards from its own processes that say nothing about the user's run: the core-worker notice
  about the PreemptionWatcher actor printed on every run, the placement-group cleaner's traceback when
  several Ray instances run on one machine, and the controller's traceback when its resource request timed
  out on a busy machine (filtered on the driver, by `INTERNAL_LINES` and `INTERNAL_TRACEBACKS`);
- storage clients (botocore, s3fs, urllib3, ...): never below INFO, at any level, on the driver and the
  workers, since their DEBUG lines carry credentials (`CREDENTIAL_LOGGERS`);
- training workers: rank 0 logs at `log_level`, the others at `log_level_replica` (HF's arguments). With
  'passive', rank 0 shows library warnings only when the driver did not already run the model (the
  driver's 2-sample loss check shows them once), so a warning appears once, not once per worker.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from typing import Optional

VERBOSE_ENV = "RAYTRAINER_VERBOSE"
# The log levels by transformers' names, the values of `log_level` and `log_level_replica`: logging's numbers, and
# 'passive' (-1, transformers' value), which leaves a logger at the level it already has. The one table:
# arguments/choices.py and arguments/process_view.py read it.
LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR,
              "critical": logging.CRITICAL, "passive": -1}
PASSIVE = "passive"


def notice(text: str) -> None:
    """A line the user must see whatever the log levels: an outage being retried, a resume that fell back, a lease
    taken over, a NaN loss. stderr, not logging: rank 0's level may be 'error' (log_level='passive'), and Ray
    forwards a worker's stderr to the driver's console."""
    print(f"[raytrainer] {text}", file=sys.stderr, flush=True)


def verbose(args=None) -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0") or getattr(args, "log_level", None) == "debug"


# Driver-side loggers whose INFO lines are notices, not results: Ray's token-authentication notice (the
# authentication stays on), MLflow's and its store's set-up messages.
QUIET_DRIVER_LOGGERS = {"ray._private.authentication.authentication_token_setup": logging.ERROR,
                        "mlflow": logging.WARNING, "alembic": logging.WARNING,
                        "ray.data": logging.WARNING}  # execution plans and progress of every Ray Dataset


def quiet_driver(args=None):
    """Lower the driver-side notices (before `ray.init`, and when a Trainer is built)."""
    quiet_credential_loggers()
    if not verbose(args):
        for name, level in QUIET_DRIVER_LOGGERS.items():
            logging.getLogger(name).setLevel(level)


# Storage clients whose DEBUG lines carry credentials: botocore logs request headers (Authorization with the
# access key id, X-Amz-Security-Token) and its credential look-ups, urllib3 logs presigned URLs with the
# token in the query string. At any log_level (debug included), they log at INFO at most, on the driver and
# on every worker: a debug log is shared in bug reports and lands in Ray's session files.
CREDENTIAL_LOGGERS = ("botocore", "boto3", "s3transfer", "aiobotocore", "s3fs", "urllib3", "aiohttp",
                      "gcsfs", "google.auth", "google.cloud", "adlfs", "azure")


def quiet_credential_loggers():
    for name in CREDENTIAL_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET or logger.level < logging.INFO:
            logger.setLevel(logging.INFO)


# Lines of Ray's own processes that the driver drops unless verbose (matched against each forwarded line).
# Also Ray Data's notice about its map actors' constructor arguments, printed for every actor pool; and the
# raylet's warning that its worker processes reached 4x its startup concurrency (8 on a 2-CPU Ray): a group's
# actors, Ray Data's, and the idle ones an embedded Ray keeps for the next pass (coordinator/cluster.py) reach it
# on a laptop, and nothing is wrong.
INTERNAL_LINES = re.compile(r"core_worker\.cc:\d+: Actor with class name: '(PreemptionWatcher|MapWorker)|"
                            r"^WARNING: \d+ PYTHON worker processes have been started on node")
# Internal lines followed by a traceback of Ray's own, dropped up to its exception line.
# Ray Train's controller also warns, with a traceback, when its resource request to Ray Data's autoscaling
# coordinator times out on a busy machine ("safe to ignore", in its own words; nothing a user can act on).
# And when a worker died, its controller's "Graceful shutdown of backend failed" ("expected if one of the
# workers has crashed"), with the ActorDiedError it caught: raytrainer's restart line names the lost rank (the
# raylet's one-line notice that a worker died stays: Ray prints it outside the forwarded logs).
INTERNAL_TRACEBACKS = re.compile(r"Failed to stop PlacementGroupCleaner gracefully|"
                                 r"Failed to send resource request for train-|"
                                 r"Graceful shutdown of backend failed")
INTERNAL_EXCEPTION = re.compile(r"^[\w.]+(Error|Exception)\b")
# The lines of such an exception's message after its first: Ray's ActorDiedError lists the actor's details,
# indented with a tab, then why it died (its last line).
INTERNAL_EXCEPTION_MORE = re.compile(r"^\t")
INTERNAL_EXCEPTION_LAST = re.compile(r"^The actor is dead because")
# Ray Data's SplitCoordinator (it streams a Ray Dataset to the training workers) prints progress lines.
INTERNAL_ACTORS = frozenset({"PlacementGroupCleaner", "SplitCoordinator"})


def filter_forwarded_logs():
    """Wrap the handler through which Ray prints its processes' output on the driver, and the function that
    prints the raylet's warnings (private Ray APIs: if they change, nothing is filtered and nothing breaks)."""
    if verbose():
        return
    _filter_raylet_warnings()
    try:
        from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:
        return
    with dispatcher._lock:
        handlers = dict(dispatcher.handlers)
        original = handlers.get("ray_print_logs")
        if original is None or getattr(original, "raytrainer_filter", False):
            return

        def filtered(data):
            if data.get("actor_name") in INTERNAL_ACTORS:
                return
            lines = _without_internal(data.get("lines", []))
            if lines:
                original({**data, "lines": lines})
        filtered.raytrainer_filter = True
        dispatcher.handlers = [(name, filtered if name == "ray_print_logs" else handler)
                               for name, handler in dispatcher.handlers]


def _filter_raylet_warnings():
    """The raylet's warnings reach the driver through `print_to_stdstream`, called by name from Ray's error
    listener thread (not through the handler above)."""
    try:
        from ray._private import worker as ray_worker
    except ImportError:
        return
    original = getattr(ray_worker, "print_to_stdstream", None)
    if original is None or getattr(original, "raytrainer_filter", False):
        return

    def filtered(data, ignore_prefix):
        lines = _without_internal(data.get("lines", []))
        if lines:
            original({**data, "lines": lines}, ignore_prefix)
    filtered.raytrainer_filter = True
    ray_worker.print_to_stdstream = filtered


def _without_internal(lines):
    """Drop internal lines, and the traceback that follows an internal warning (up to its exception line)."""
    kept, skipping, in_message = [], False, False
    for line in lines:
        if INTERNAL_LINES.search(line):
            continue
        if INTERNAL_TRACEBACKS.search(line):
            skipping = True
            continue
        if skipping and (line.startswith((" ", "Traceback")) or not line.strip()):
            continue
        if skipping and INTERNAL_EXCEPTION.match(line):
            skipping, in_message = False, True
            continue
        if in_message and INTERNAL_EXCEPTION_MORE.match(line):
            continue
        if in_message and INTERNAL_EXCEPTION_LAST.match(line):
            in_message = False
            continue
        skipping = in_message = False
        kept.append(line)
    return kept


def ray_train_log_level(args) -> str:
    """Ray Train's log level for a run (its `LoggingConfig`): WARNING unless verbose."""
    return "DEBUG" if verbose(args) else "WARNING"


def worker_level(args, rank: int, driver_ran_model: bool) -> str:
    """The log level a training worker uses, decided on the driver and shipped with the job."""
    if verbose(args):
        return "debug"
    if rank != 0:
        return args.log_level_replica
    if args.log_level == PASSIVE:
        return "error" if driver_ran_model else "warning"
    return args.log_level


def configure_worker(level: Optional[str]):
    """Apply a worker's level to Python logging, warnings, and transformers when it is in use."""
    quiet_credential_loggers()  # also with level None/passive: a user's root logger at DEBUG must not leak them
    if level is None or level == PASSIVE:
        return
    number = LOG_LEVELS[level]
    logging.getLogger().setLevel(number)
    # Ray Data sets its own logger to INFO: a worker reading an evaluation dataset would print its plans.
    logging.getLogger("ray.data").setLevel(max(number, logging.WARNING) if number > logging.DEBUG else number)
    if number > logging.WARNING:
        warnings.simplefilter("ignore")
    if "transformers" not in sys.modules:
        # Not imported (yet): importing it here would lengthen each worker's start-up (startup.py's
        # "unpack" phase). transformers reads these when a later import (a model_init, say) brings it in.
        os.environ["TRANSFORMERS_VERBOSITY"] = level
        if number > logging.DEBUG:
            os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
            hub = sys.modules.get("huggingface_hub.utils")
            if hub is not None:  # in use already (datasets brings it): it read the variable once, before this;
                hub.disable_progress_bars()  # transformers' bars follow hub's switch when it is imported
        return
    import transformers.utils.logging as hf_logging

    hf_logging.set_verbosity(number)
    if number > logging.DEBUG:
        hf_logging.disable_progress_bar()  # the driver's bar shows progress; the workers' would interleave
