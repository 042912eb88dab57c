"""A quiet console by default (raytrainer/verbosity.py): each worker's log level as HF's arguments set it (rank 0
at log_level, the others at log_level_replica, 'passive' showing library warnings once), storage clients never
below INFO (their DEBUG lines carry credentials), and Ray's own forwarded lines dropped, user lines kept. How the
console reads as a whole: tests/integration/test_console.py."""

import logging

import pytest

from raytrainer import TrainingArguments
from raytrainer.verbosity import (
    CREDENTIAL_LOGGERS,
    VERBOSE_ENV,
    _without_internal,
    quiet_credential_loggers,
    ray_train_log_level,
    verbose,
    worker_level,
)


@pytest.fixture
def quiet(monkeypatch):
    monkeypatch.delenv(VERBOSE_ENV, raising=False)


def args(**kw):
    return TrainingArguments(output_dir="unused", num_workers=0, **kw)


def test_rank_0_logs_at_log_level_the_others_at_log_level_replica(quiet):
    given = args(log_level="info", log_level_replica="error")
    assert [worker_level(given, rank, driver_ran_model=True) for rank in (0, 1, 2)] == ["info", "error", "error"]
    assert ray_train_log_level(given) == "WARNING" and not verbose(given)


def test_passive_shows_library_warnings_once(quiet):
    """The driver's loss check ran the model and showed its warnings: rank 0 does not show them again."""
    passive = args()  # log_level='passive', HF's default
    assert worker_level(passive, 0, driver_ran_model=True) == "error"
    assert worker_level(passive, 0, driver_ran_model=False) == "warning"


def test_one_switch_brings_everything_back(monkeypatch):
    monkeypatch.setenv(VERBOSE_ENV, "1")
    given = args(log_level="error", log_level_replica="error")
    assert worker_level(given, 1, driver_ran_model=True) == "debug" and ray_train_log_level(given) == "DEBUG"
    monkeypatch.setenv(VERBOSE_ENV, "0")
    assert not verbose(given) and verbose(args(log_level="debug"))


def test_storage_clients_never_log_below_info():
    loggers = [logging.getLogger(name) for name in CREDENTIAL_LOGGERS]
    before = [logger.level for logger in loggers]
    try:
        logging.getLogger("botocore").setLevel(logging.DEBUG)  # a user's debug set-up
        logging.getLogger("s3fs").setLevel(logging.ERROR)  # quieter than INFO: left as it is
        logging.getLogger("urllib3").setLevel(logging.NOTSET)  # would inherit a DEBUG root
        quiet_credential_loggers()
        levels = {logger.name: logger.level for logger in loggers}
        assert levels["botocore"] == logging.INFO and levels["urllib3"] == logging.INFO
        assert levels["s3fs"] == logging.ERROR
        assert all(level >= logging.INFO for level in levels.values())
    finally:
        for logger, level in zip(loggers, before):
            logger.setLevel(level)


def test_rays_own_lines_and_their_tracebacks_are_dropped_user_lines_kept():
    lines = [
        "step 1 done",
        "[2026-11-27 10:00:00,000 I 1 1] core_worker.cc:512: Actor with class name: 'PreemptionWatcher' and ID",
        "WARNING: 8 PYTHON worker processes have been started on node: 09f1 with address: 192.0.2.2, which is "
        "4x the maximum expected startup concurrency (2).",
        "Failed to stop PlacementGroupCleaner gracefully.",
        "Traceback (most recent call last):",
        '  File "ray/train/v2/_internal/.../placement_group_cleaner.py", line 40, in stop',
        "ray.exceptions.ActorDiedError: The actor died",
        "Traceback (most recent call last):",  # the user's own traceback: kept
        '  File "train.py", line 3, in <module>',
        "ValueError: bad row",
        "",
        "step 2 done",
    ]
    assert _without_internal(lines) == ["step 1 done", "Traceback (most recent call last):",
                                        '  File "train.py", line 3, in <module>', "ValueError: bad row", "",
                                        "step 2 done"]


def test_a_lost_workers_internal_lines_are_dropped_and_the_next_line_kept():
    """What Ray Train's controller prints when a worker dies (its failed backend shutdown and the ActorDiedError
    it caught, with its tab-indented details): raytrainer's restart line says it in one line."""
    from raytrainer.verbosity import _without_internal

    lines = ["Graceful shutdown of backend failed. This is expected if one of the workers has crashed.",
             "Traceback (most recent call last):", '  File "config.py", line 333, in on_shutdown',
             "    ray.get(futures, timeout=timeout_s)",
             "ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.",
             "\tclass_name: RayTrainWorker", "\tpid: 2218", "\tip: 192.0.2.2",
             "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR ...",
             "\ta print's own tab-indented line", "[raytrainer] restarting this run from checkpoint-2"]
    assert _without_internal(lines) == ["\ta print's own tab-indented line",
                                        "[raytrainer] restarting this run from checkpoint-2"]


def test_the_raylets_worker_count_warning_is_dropped_and_its_other_notices_kept(monkeypatch):
    """The raylet's warnings are printed by Ray's error listener through `print_to_stdstream`, not the log
    handler: its "N PYTHON worker processes have been started" (reached on a 2-CPU embedded Ray that keeps idle
    workers for Ray Data's next pass) goes, a lost worker's notice stays."""
    from ray._private import worker as ray_worker

    from raytrainer.verbosity import _filter_raylet_warnings

    printed = []
    monkeypatch.setattr(ray_worker, "print_to_stdstream", lambda data, ignore_prefix: printed.append(data["lines"]))
    _filter_raylet_warnings()
    _filter_raylet_warnings()  # once wrapped, not twice
    count = ("WARNING: 8 PYTHON worker processes have been started on node: 8f1a with address: 192.0.2.2, which "
             "is 4x the maximum expected startup concurrency (2).")
    died = "A worker died or was killed while executing a task by an unexpected system error."
    ray_worker.print_to_stdstream({"lines": [count], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    ray_worker.print_to_stdstream({"lines": [died], "pid": "raylet", "is_err": False}, ignore_prefix=False)
    assert printed == [[died]]


def test_a_worker_level_quiets_transformers_bars_when_hub_came_first():
    """A process where huggingface_hub is imported before the worker's level is applied and transformers after it
    (a num_workers=0 Tune trial: datasets brings hub, model_init brings transformers): hub read its progress-bar
    variable once, before the level was set, so the level switches hub's bars off itself, and transformers' bars
    ("Writing model shards" at each checkpoint, from every trial) follow. In a fresh process: the switch is
    process-wide."""
    import subprocess
    import sys

    code = ("import sys, huggingface_hub.utils as hub\n"
            "assert not hub.are_progress_bars_disabled()  # read, as datasets does at its import\n"
            "from raytrainer.verbosity import configure_worker\n"
            "assert 'transformers' not in sys.modules\n"
            "configure_worker('warning')\n"
            "import transformers.utils.logging as hf_logging\n"
            "print(hf_logging.is_progress_bar_enabled())\n")
    env = {k: v for k, v in __import__("os").environ.items() if k != "HF_HUB_DISABLE_PROGRESS_BARS"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip() == "False"
