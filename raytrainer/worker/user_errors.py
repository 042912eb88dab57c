"""A worker's error as the user reads it on the driver: one line naming the job, the rank, the user's method
that raised (an override, a callback, compute_metrics...) and where, instead of a page of Ray traceback.

`WorkerError` carries that line and the full traceback (`TrainingError.worker_traceback` on the driver;
printed by the worker only when verbose). Which method is "the user's": the first frame, after the last
frame of raytrainer itself, that is not library code (the standard library, site-packages, raytrainer).
"""

from __future__ import annotations

import logging
import os
import traceback
from typing import List, Optional, Tuple

from ..code_paths import interpreter_dirs

MAX_MESSAGE = 500  # characters of the exception's own message (the full one is in worker_traceback)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class WorkerError(RuntimeError):
    """What a worker raises in place of a user's exception: picklable, its message complete."""

    def __init__(self, message: str, worker_traceback: str = "", in_collective: bool = False, fatal: bool = False,
                 job: Optional[str] = None):
        super().__init__(message)
        self.worker_traceback = worker_traceback
        # The id of the job whose code raised it: that job's failure, whichever ranks had taken it (jobs.py).
        self.job = job
        # Raised inside torch.distributed (a peer that failed first closed the connection): the driver names
        # another rank's error before this one.
        self.in_collective = in_collective
        # A restart cannot help (lost storage, a module no node has): the job fails at once (FailureRecorder).
        self.fatal = fatal

    def __reduce__(self):
        return (type(self), (str(self), self.worker_traceback, self.in_collective, self.fatal, self.job))

    @classmethod
    def of(cls, exc: BaseException, rank: int, kind: str, fatal: bool = False,
           job: Optional[str] = None) -> "WorkerError":
        """Call from the `except` block that caught `exc` (its traceback is the one being handled). Fatal when
        `fatal` or when `exc` says so (its `fatal` attribute); `job`: the id of the job that raised it."""
        return cls(describe(exc, rank, kind), traceback.format_exc(), _in_collective(exc),
                   fatal or bool(getattr(exc, "fatal", False)), job)


# What a rank raises when a peer's process went away under a collective (DDP's all-reduce runs in autograd's
# C++ hooks, so no torch.distributed frame need show).
_PEER_LOST = ("[gloo]", "gloo/", "NCCL", "Connection closed by peer", "Connection reset by peer")


def _in_collective(exc: BaseException) -> bool:
    if type(exc).__name__ in ("DistBackendError", "DistNetworkError", "DistStoreError"):
        return True
    if any(part in str(exc) for part in _PEER_LOST):
        return True
    return any(f"{os.sep}torch{os.sep}distributed{os.sep}" in frame.f_code.co_filename
               for frame, _ in traceback.walk_tb(exc.__traceback__))


def _is_ours(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_PACKAGE + os.sep)


def _is_library(filename: str, library: Tuple[str, ...]) -> bool:
    path = os.path.abspath(filename)
    return _is_ours(filename) or path.startswith(library) or filename.startswith("<")


def user_frame(exc: BaseException) -> Tuple[Optional[str], Optional[str]]:
    """(the user's method that raised, 'file:line' of the innermost user code), either None if not found."""
    frames: List = [(f.f_code, lineno) for f, lineno in traceback.walk_tb(exc.__traceback__)]
    library = interpreter_dirs()
    last_ours = max((i for i, (code, _) in enumerate(frames) if _is_ours(code.co_filename)), default=-1)
    called = next(((code, line) for code, line in frames[last_ours + 1:]
                   if not _is_library(code.co_filename, library)), None)
    innermost = next(((code, line) for code, line in reversed(frames)
                      if not _is_library(code.co_filename, library)), None)
    called = called or innermost  # raytrainer raised, called from user code: name that code
    method = getattr(called[0], "co_qualname", called[0].co_name) if called else None
    where = f"{os.path.basename(innermost[0].co_filename)}:{innermost[1]}" if innermost else None
    return method, where


def describe(exc: BaseException, rank: int, kind: str) -> str:
    """`train() failed on worker rank 1: CustomTrainer.compute_loss raised ValueError: bad labels (script.py:12)`."""
    method, where = user_frame(exc)
    text = str(exc) if len(str(exc)) <= MAX_MESSAGE else str(exc)[:MAX_MESSAGE] + " [...]"
    what = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    said = f"{method} raised {what}" if method else what
    place = f" ({where})" if where else ""
    hint = ""
    missing = _missing_module(exc)
    if missing is not None:
        hint = " " + missing_module_hint(missing.name)
    end = "" if place == "" and said.endswith((".", "!", "?")) else "."
    call = "the script" if str(kind) == "script" else f"{kind}()"  # `raytrainer launch script.py`
    return f"{call} failed on worker rank {rank}: {said}{place}{end}{hint}"


def _missing_module(exc: BaseException) -> Optional[ModuleNotFoundError]:
    """The ModuleNotFoundError behind `exc`: itself, or what it was raised from (an unpickling error wraps it)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, ModuleNotFoundError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)  # as tracebacks show
    return None


def missing_module_hint(name: Optional[str]) -> str:
    return (f"The workers cannot import {name!r}. raytrainer puts the driver's sys.path on the workers and, on a "
            "multi-node cluster, ships the modules the driver imported from outside site-packages; this one was "
            "in neither. Install it on every node, or start Ray with its code: ray.init(runtime_env={'working_dir':"
            " '.', 'py_modules': [...]}) or `ray job submit --working-dir . --runtime-env-json ...`, or put its "
            "folder on the workers' PYTHONPATH (runtime_env={'env_vars': {'PYTHONPATH': ...}}, or PYTHONPATH set "
            "on every node before `ray start`).")


class DropWrappedTracebacks(logging.Filter):
    """Ray Train logs every training-function error with its traceback on the worker, which Ray forwards to
    the driver's console. For a WorkerError the driver already says it in one line: drop that record."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Error in training function") and WorkerError.__name__ in message)


def quiet_wrapped_tracebacks():
    """On a worker, unless verbose: Ray Train's logger for training-function errors (internal name)."""
    from ..verbosity import verbose

    if not verbose():
        logger = logging.getLogger("ray.train.v2._internal.util")
        if not any(isinstance(f, DropWrappedTracebacks) for f in logger.filters):
            logger.addFilter(DropWrappedTracebacks())
