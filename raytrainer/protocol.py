"""The messages between the driver, the event sink actor and the workers.

Every arrow below is a Ray actor call on the sink (`coordinator/sink.py`); `⇐` is what it returns. The sink
lives on the driver's node for a worker group's life; workers and Ray Train's controller reach it through
its handle.

    driver    → post_job(Job, max_failures) ⇐ Posted          the job board: one job at a time
    worker    → next_job(last_id, rank, world_size) ⇐ Job | None   (None: the board closed, return)
    worker    → push([Event | Stall, ...])                      buffered by the worker's Emitter
    rank 0    → push_and_await([Event, ...]) ⇐ Decision         queues the events, then a ControlRequest
    driver    → decide(ControlRequest.id, Decision)             once it has handled every message before it
    rank 0    → push_and_claim([Event, ...], HostedClaim, job) ⇐ HostedClaimReply
                                                                a hosted Trainer's train() begins: queues the
                                                                events, then a ClaimRequest
    driver    → answer_claim(ClaimRequest.id, HostedClaimReply) the hosted handler's answer (hosting/)
    rank 0    → set_result(result, job)                         queues ResultReady
    controller→ record_failure(cause, error, fatal, raised_by) ⇐ give_up   queues Failure (re-served) or JobFailed
    any       → record_cause(Reason, text)                       why the current worker group is ending
    rank 0    → group_started(GroupStart) ⇐ RestartHistory | None
    driver    → request_stop(reason); rank 0 → wait_stop ⇐ reason | None     Ctrl-C
    driver    → wait_events(timeout) ⇐ [Event | ControlRequest | ClaimRequest | ResultReady | Failure | JobFailed
                                         | Stall]

Inside a Job's payload travels the pickled pair (trainer, work order): a `TrainOrder`, `EvaluateOrder` or
`PredictOrder` (`transfer.pack_job`, read by `worker/entry.py`). Rank 0's result is a `TrainResult`,
`EvaluateResult` or `PredictResult`; no dict travels between the driver and the workers but the user's own
values (metrics, callback states, a trainer_state.json record).

The driver reads the queue in arrival order; a message with another job's id is a finished job's straggler
and is dropped (a Stall is told whatever its job). Everything here is a frozen dataclass with slots: Ray
pickles each one, and a plain class with a few fields costs about what the dict it replaces did.

This module is foundation level: the worker, callbacks and coordinator layers all import it.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, FrozenSet, Mapping, Optional, Sequence, Tuple, Union


class Kind(enum.Enum):
    """What a message is. The driver's pump dispatches on it (`coordinator/pump.py`)."""
    JOB = "job"                          # driver → workers: run this (the job board)
    EVENT = "event"                      # a callback event from a rank (callbacks/event_names.py names, or "error")
    CONTROL_REQUEST = "control_request"  # rank 0 waits for the driver's decision on the events before it
    HOSTED_CLAIM = "hosted_claim"        # rank 0 of a hosted job claims an output_dir and waits for the reply
    DECISION = "decision"                # the driver's answer: control flags and callback states
    RESULT_READY = "result_ready"        # rank 0 handed in the job's result: the driver takes it
    FAILURE = "failure"                  # a worker group failed; the job in flight is re-served
    JOB_FAILED = "job_failed"            # ... past the job's max_failures (or fatal): the driver raises
    STALL = "stall"                      # a rank made no progress for a while (the hang watchdog)


class JobKind(str, enum.Enum):
    """The calls a worker group serves. A str, so a job's kind reads as its name (`train()` failed on ...)."""
    TRAIN = "train"
    EVALUATE = "evaluate"
    PREDICT = "predict"
    SAVE_MODEL = "save_model"  # the hosted mode's save_model() (hosting/)
    SCRIPT = "script"          # `raytrainer launch script.py`: every rank runs the script (hosting/)

    def __str__(self) -> str:
        return self.value


class Reason(str, enum.Enum):
    """Why a worker group ended, as recorded in trainer_state.json's restarts ("reason")."""
    FAILURE = "failure"        # a worker died or raised (Ray Train's UserCallback)
    PREEMPTION = "preemption"  # rank 0, after the preemption checkpoint committed
    RESIZE = "resize"          # Ray Train's elastic monitor found room for another size
    HANG = "hang"              # a rank stalled past hang_timeout_s: its watchdog ended the worker
    RESTART = "restart"        # none of the above was recorded

    def __str__(self) -> str:
        return self.value


# The event a failed rank sends with its traceback (callbacks see it as `on_error(traceback=...)`).
ERROR = "error"


# ---------------------------------------------------------------------------------------- driver → workers
@dataclass(frozen=True, slots=True)
class Job:
    """A job on the board. `payload`: the pickled (trainer, work order) of `transfer.pack_job`, `data`: the object
    ref of its arrays, `code`: the driver's import path and modules (`code_paths.DriverCode`), `taken_at`: when
    rank 0 took it (`time.time()` of the sink, on the driver's node: the end of `group start` in startup.py)."""
    id: str
    job_kind: JobKind
    payload: bytes
    data: Any
    code: Any = None
    taken_at: Optional[float] = None
    kind: ClassVar[Kind] = Kind.JOB


@dataclass(frozen=True, slots=True)
class Posted:
    """`post_job`'s answer. `closed`: why the board had closed (the driver then starts another group);
    `idle_failures`: the failures the group went through while idle, for the driver to tell."""
    closed: Optional[str] = None
    idle_failures: Tuple[str, ...] = ()

    @property
    def posted(self) -> bool:
        return self.closed is None


@dataclass(frozen=True, slots=True)
class Decision:
    """The driver's control decision: the flags its callbacks set, and their exported states (saved with the
    next checkpoint's trainer_state.json)."""
    flags: Mapping[str, bool] = field(default_factory=dict)
    states: Mapping[str, Any] = field(default_factory=dict)
    kind: ClassVar[Kind] = Kind.DECISION


# ---------------------------------------------------------------------------------------- work orders
@dataclass(frozen=True, slots=True)
class LogLevels:
    """The log level of each worker, decided on the driver (`verbosity.worker_level`): rank 0's, and the other
    ranks' (HF's log_level and log_level_replica). None leaves a worker's logging as it is."""
    rank0: Optional[str] = None
    replica: Optional[str] = None

    def for_rank(self, rank: int) -> Optional[str]:
        return self.rank0 if rank == 0 else self.replica


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkOrder:
    """What a job asks of the workers, pickled with the trainer. Every order carries the driver's callback
    set-up: the events after which rank 0 waits for the driver's decision (`control_points`), those a driver
    callback implements (`heard`: rank 0 leaves out the per-step ones nobody there listens to), the callbacks
    that run on every rank (`rank_callbacks`, pickled here: the trainer travels without its callbacks) and
    the workers' log levels. `job_kind` names the call (the `Job` that carries the order has the same)."""
    control_points: FrozenSet[str] = frozenset()
    heard: FrozenSet[str] = frozenset()  # the events a driver callback implements (CallbackHandler.heard)
    rank_callbacks: Tuple[Any, ...] = ()
    log_levels: LogLevels = LogLevels()
    job_kind: ClassVar[JobKind]

    def __post_init__(self):
        if not isinstance(self.control_points, frozenset):
            object.__setattr__(self, "control_points", frozenset(self.control_points))
        if not isinstance(self.rank_callbacks, tuple):
            object.__setattr__(self, "rank_callbacks", tuple(self.rank_callbacks))


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainOrder(WorkOrder):
    """`train()`: `run_id` names this run (its checkpoints' lease, trainer_state.json); `resume_from` is the
    committed checkpoint the driver chose (None: this run's newest, if a restarted group finds one);
    `own_hyperparameters`: a resume keeps the arguments' optimizer hyperparameters (a PBT trial continuing another
    trial's checkpoint, tune/trial.py), not the checkpoint's."""
    run_id: str
    resume_from: Optional[str] = None
    own_hyperparameters: bool = False
    job_kind: ClassVar[JobKind] = JobKind.TRAIN

    def __post_init__(self):
        WorkOrder.__post_init__(self)
        if not isinstance(self.run_id, str) or not self.run_id:
            raise ValueError(f"a TrainOrder needs a run id, got {self.run_id!r}")


@dataclass(frozen=True, slots=True, kw_only=True)
class DatasetOrder(WorkOrder):
    """A pass over one dataset: `dataset` (a Ray Dataset travels as a `data/ray_data.RayDataRef`), the
    metrics' `prefix`, and the output keys that are no predictions (`ignore_keys`, as the user gave them)."""
    dataset: Any
    prefix: str
    ignore_keys: Optional[Sequence[str]] = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EvaluateOrder(DatasetOrder):
    """`evaluate()` on one dataset (a dict of eval datasets is one order per dataset)."""
    job_kind: ClassVar[JobKind] = JobKind.EVALUATE


@dataclass(frozen=True, slots=True, kw_only=True)
class PredictOrder(DatasetOrder):
    """`predict()`: the predictions are kept and returned, not only the metrics."""
    job_kind: ClassVar[JobKind] = JobKind.PREDICT


@dataclass(frozen=True, slots=True, kw_only=True)
class HostedOrder(WorkOrder):
    """The hosted mode (hosted/, worker/hosted/): a `transformers.Trainer` subclass runs on every rank as the
    user wrote it. The order travels beside its target: a `HostedScript` (`raytrainer launch`: every rank runs
    the script) or a `HostedCall` (the Python API: build the trainer, call `method`). `run_id` names the job's
    leases and commits; `resume`: a Trainer whose train() gets no resume_from_checkpoint continues from its
    output_dir's newest committed checkpoint; `storage_options`: for a remote output_dir; `callback_decisions`,
    `hang_warning_s`, `hang_timeout_s`: as TrainingArguments' (the hang watchdog on each rank; 0: off)."""
    run_id: str
    method: Optional[str] = None  # None: a script
    resume: bool = True
    storage_options: Optional[Dict[str, Any]] = None
    callback_decisions: str = "same_step"
    hang_warning_s: float = 0.0
    hang_timeout_s: float = 0.0

    @property
    def job_kind(self) -> JobKind:
        return JobKind.SCRIPT if self.method is None else JobKind(self.method)


class HostedScript:
    """`raytrainer launch`'s target: the script's text (read on the driver: a worker on another node need not
    have the file), its path (its `__file__`, and its folder on sys.path where the node has it), its arguments
    and the driver's working directory (a relative output_dir means the same folder as under torchrun)."""

    def __init__(self, path: str, text: str, argv: Sequence[str], cwd: str):
        self.path, self.text, self.argv, self.cwd = path, text, tuple(argv), cwd


class HostedCall:
    """The Python API's target: `factory(*args, **kwargs)` builds the trainer on each rank (a
    `transformers.Trainer` subclass, or a function returning one), then `method(*call_args, **call_kwargs)`
    runs. `args_class(**args_fields)` rebuilds the trainer's arguments object on the rank (one built on the
    driver and shipped would keep the driver's one-process accelerate state); `trained_state`: the weights of
    this trainer's last hosted train(), loaded into its model before the call. A plain class (not slots): the
    transfer walks its attributes to find the modules whose tensors travel by the object store."""

    def __init__(self, factory: Any, args: tuple, kwargs: Dict[str, Any], args_class: Any = None,
                 args_fields: Optional[Dict[str, Any]] = None, call_args: tuple = (),
                 call_kwargs: Optional[Dict[str, Any]] = None, trained_state: Any = None):
        self.factory, self.args, self.kwargs = factory, tuple(args), dict(kwargs)
        self.args_class, self.args_fields = args_class, args_fields
        self.call_args, self.call_kwargs = tuple(call_args), dict(call_kwargs or {})
        self.trained_state = trained_state


@dataclass(frozen=True, slots=True)
class HostedClaim:
    """Rank 0 of a hosted job, as a Trainer's train() begins: the output_dir it writes (an absolute path or a
    URL), the Trainer (its class, and its number among the Trainers this job built: 0, 1, ...) and the
    resume_from_checkpoint the script passed. The driver takes the output_dir's lease and chooses the
    checkpoint (hosting/hosted_handler.py). It travels in a `ClaimRequest`; the answer is a `HostedClaimReply`.
    `lease_only`: the claim rank 0 makes as the Trainer is built, so that an output_dir the driver cannot take
    (another run's, storage without credentials) is refused before the script prepares data or trains; the
    driver takes the lease and chooses nothing yet."""
    output_dir: str
    trainer: str
    index: int
    requested: Union[str, bool, None] = None  # resume_from_checkpoint as the script gave it (a path, True, False)
    report_to: Tuple[str, ...] = ()
    lease_only: bool = False


@dataclass(frozen=True, slots=True)
class HostedClaimReply:
    """The driver's answer to a `HostedClaim`: the committed checkpoint to resume from (None: start), the other
    checkpoints HF will read (the best one, for load_best_model_at_end), or the error every rank raises."""
    resume_from: Optional[str] = None
    also_fetch: Tuple[str, ...] = ()
    error: Optional[str] = None


# ---------------------------------------------------------------------------------------- results
# How a train job ended early: Ctrl-C on the driver (train() raises KeyboardInterrupt), or a preemption at the
# last step (a preemption before it hands over to Ray Train, which restarts the group: no result).
STOPPED = (None, "interrupt", "preemption")


@dataclass
class SharedState:
    """A state dict in the object store (`transfer.put_state`): `ref` holds {"arrays": [...], "entries": {name:
    entry}}. Here, not in transfer.py: a result that carries it passes through the event sink, whose process then
    unpickles this class, and transfer.py imports torch (1-2 CPU seconds in every sink's start)."""
    ref: Any
    nbytes: int


@dataclass(frozen=True, slots=True)
class TrainResult:
    """Rank 0's result of a train job. `state`: trainer_state.json's text; `model_state`: the trained weights,
    a state dict on the worker, `transfer.SharedState` once put into the object store (`worker/entry.py`), None
    once the driver copied them into its model; `train_output`: a `state.TrainOutput`; `stopped`: see STOPPED."""
    state: str
    model_state: Any
    train_output: Any
    stopped: Optional[str] = None

    def __post_init__(self):
        if self.stopped not in STOPPED:
            raise ValueError(f"stopped={self.stopped!r}: one of {STOPPED}")

    @property
    def interrupted(self) -> bool:
        """Ctrl-C: every rank saved at one step boundary and the run ended."""
        return self.stopped == "interrupt"


@dataclass(frozen=True, slots=True)
class EvaluateResult:
    """Rank 0's result of an evaluate job: the metrics, already prefixed (`eval_loss`, ...)."""
    metrics: Dict[str, Any]


@dataclass(frozen=True, slots=True)
class PredictResult:
    """Rank 0's result of a predict job: a `state.PredictionOutput` (predictions, label ids, metrics)."""
    prediction: Any


@dataclass(frozen=True, slots=True)
class HostedResult:
    """Rank 0's result of a hosted job: `runs`, one record per Trainer that trained ({"trainer", "output_dir",
    "global_step", "checkpoint"}); `value`: what the called method returned (a script: None); `model_state`:
    after a hosted train(), the trained weights (as in `TrainResult`)."""
    runs: Tuple[Dict[str, Any], ...] = ()
    value: Any = None
    model_state: Any = None


# ---------------------------------------------------------------------------------------- workers → driver
@dataclass(frozen=True, slots=True)
class Event:
    """A callback event (`callbacks/event_names.py`), or "error" with a rank's traceback. `payload` holds the
    callback's keyword arguments (global_step and epoch included)."""
    name: str
    rank: int
    job: Optional[str]
    payload: Mapping[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)
    kind: ClassVar[Kind] = Kind.EVENT

    def as_callback_event(self) -> Dict[str, Any]:
        """The callbacks' own event shape (`CallbackHandler.handle`)."""
        return {"kind": self.name, "rank": self.rank, "time": self.time, **self.payload}  # a restart has its own time


@dataclass(frozen=True, slots=True)
class ControlRequest:
    """Queued by the sink after the events rank 0 sent with it; `id` is what the decision answers."""
    id: int
    rank: int = 0
    time: float = field(default_factory=time.time)
    job: Optional[str] = None
    kind: ClassVar[Kind] = Kind.CONTROL_REQUEST


@dataclass(frozen=True, slots=True)
class ClaimRequest:
    """Queued by the sink after the events rank 0 sent with its `HostedClaim`; `id` is what the reply answers."""
    id: int
    claim: HostedClaim
    job: Optional[str] = None
    time: float = field(default_factory=time.time)
    kind: ClassVar[Kind] = Kind.HOSTED_CLAIM


@dataclass(frozen=True, slots=True)
class ResultReady:
    """Rank 0 handed in `job`'s result; it stays in the sink until the driver reads it."""
    job: Optional[str]
    time: float = field(default_factory=time.time)
    kind: ClassVar[Kind] = Kind.RESULT_READY


@dataclass(frozen=True, slots=True)
class Failure:
    """A worker group failed while `job` ran; Ray Train replaces the group and the job is re-served."""
    job: str
    cause: str
    error: str
    time: float = field(default_factory=time.time)
    kind: ClassVar[Kind] = Kind.FAILURE


@dataclass(frozen=True, slots=True)
class JobFailed:
    """`job` failed for good (past its max_failures, or an error no restart can help): the driver raises
    `error`."""
    job: str
    cause: str
    error: str
    time: float = field(default_factory=time.time)
    kind: ClassVar[Kind] = Kind.JOB_FAILED


@dataclass(frozen=True, slots=True)
class Stall:
    """A rank has made no progress for `seconds` in `phase` (a hook such as "callback on_step_end", or a
    collective): reported by the hang watchdog, printed by the driver as a warning."""
    rank: int
    phase: str
    seconds: float
    job: Optional[str] = None
    time: float = field(default_factory=time.time)
    kind: ClassVar[Kind] = Kind.STALL

    def describe(self) -> str:
        return f"[raytrainer] rank {self.rank} has made no progress for {self.seconds:.0f} s in {self.phase}"


# ---------------------------------------------------------------------------------------- restarts
@dataclass(frozen=True, slots=True)
class GroupStart:
    """What rank 0 of each new worker group tells the sink once (`group_started`)."""
    world_size: int
    global_step: int
    checkpoint: Optional[str]
    gradient_accumulation_steps: int
    # The own loop rescales gradient_accumulation_steps to keep the global batch over a resize; a hosted script's
    # Trainer keeps its own arguments, so its global batch follows the world size.
    keeps_global_batch: bool = True


@dataclass(frozen=True, slots=True)
class RestartHistory:
    """`group_started`'s answer for a group that replaces another in the same job: the restart record (why
    the previous group ended), the resize record if the world size changed, and every restart and resize of
    the job so far. The records are plain dicts: they go into trainer_state.json as they are."""
    restart: Dict[str, Any]
    resize: Optional[Dict[str, Any]]
    restarts: Tuple[Dict[str, Any], ...]
    resizes: Tuple[Dict[str, Any], ...]
