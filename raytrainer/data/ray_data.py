"""`ray.data.Dataset` input, driver side: how a Ray Dataset reaches the workers.

A Ray Dataset is a plan (and, once materialized, references to its blocks), not rows. The driver replaces it
by a `RayDataRef` (a name, its row count when Ray knows it without running the pipeline, a one-row sample,
and the dataset itself). The dataset travels with the job through the object store, serialized by Ray
(`transfer.py`: its block references stay tracked), and each job makes its own split on the workers, so a
worker group serves any number of jobs on any Ray Datasets (`coordinator/group.py`). Preprocessing
(`map_batches`) runs on Ray Data's own tasks and actors.

How it is split (`RayDataRef.iterator`, called by every rank as a job's training data is set up):

- Training data is split by streaming (`streaming_split`) with `preserve_order`: Ray's splitter then hands
  each block, in order, to the split with the fewest rows so far, so the same dataset split over the same
  number of workers gives every worker the same rows, epoch after epoch and after a restart. That is what
  makes a resume exact (each rank skips the rows of its shard it had consumed). Rank 0 makes the split (its
  coordinator actor belongs to rank 0, so it goes with the job, or with the group if the group fails: the
  group that replaces it splits afresh) and hands it to the other ranks (`broadcast_from_rank_zero`).
- When the row count is known, the dataset is padded with copies of its first rows (marked, never trained
  on) to a multiple of the world size and split with `equal=True`: every rank gets the same number of rows,
  so the epoch's length is known in advance and no row is dropped. When it is unknown (a `map_batches`
  pipeline), the split is `equal=False` (no row dropped either) and the ranks agree at every micro-step
  whether any of them still has data; one that has none trains on a zero-weight filler batch.
- The padding is raytrainer's one Ray Data step: its tasks ask `OWN_TASK_CPUS`, a fraction of a CPU, so that they
  run beside training workers that hold all but a fraction of the CPUs. What a pipeline's own steps ask
  (`cpu_asks`) is checked against what the workers leave free before any worker starts
  (`coordinator/cluster.py`): a step that asks more than is left would wait forever.
- Evaluation and prediction data is not split: every rank reads the whole stream and keeps every
  world-size-th batch, so the gathered predictions can be put back in dataset order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..errors import ConfigError
from ..protocol import DatasetOrder, TrainOrder, WorkOrder
from ..transfer import is_ray_dataset

# Marks the padding rows added to make the row count a multiple of the world size.
PAD_COLUMN = "__raytrainer_pad__"
TRAIN = "train"
# CPUs each task of raytrainer's own Ray Data step (the padding's marks) asks. At Ray Data's default (1 CPU) it
# waited forever beside 2 workers of 0.75 CPU on a 2-CPU Ray; preflight leaves at least this much free.
OWN_TASK_CPUS = 0.25
# What a Ray Data task or actor asks when its step does not say (Ray Data's MapOperator and read tasks).
DEFAULT_STEP_CPUS = 1.0


def known_row_count(dataset) -> Optional[int]:
    """The row count if Ray knows it from metadata (a read, `from_items`, `range`, a materialized dataset);
    None when only running the pipeline would tell (after `map_batches`, `filter`, ...)."""
    meta_count = getattr(dataset, "_meta_count", None)  # the public count() would run the pipeline
    try:
        return meta_count() if meta_count is not None else None
    except Exception:
        return None


@dataclass
class RayDataRef:
    """What a worker receives in place of a Ray Dataset."""
    name: str
    num_rows: Optional[int]
    sample: List[dict] = field(default_factory=list)  # a row or two: the filler of a rank left without data
    split: bool = True
    dataset: Any = None  # the ray.data.Dataset (it travels beside the pickle: transfer.py)

    def iterator(self, rank: int = 0, world_size: int = 1, drop_last: bool = False):
        """This rank's stream: the whole dataset (evaluation, or one rank), else its part of the job's split.
        Every rank must call it at once when `split` and `world_size` > 1 (the split is handed out by rank 0)."""
        dataset = ordered(self.dataset)
        if not self.split or world_size == 1:
            return dataset.iterator()
        return _split_part(dataset, self.num_rows, drop_last, rank, world_size)


def _split_part(dataset, num_rows: Optional[int], drop_last: bool, rank: int, world_size: int):
    """Rank 0 splits, the others get its split's coordinator and read their part of it (module docstring)."""
    from ray.data._internal.iterator.stream_split_iterator import StreamSplitDataIterator
    from ray.train.collective import broadcast_from_rank_zero

    parts = None
    if rank == 0:
        equal = num_rows is not None
        if equal and not drop_last:
            dataset = pad_to_multiple(dataset, num_rows, world_size)
        parts = dataset.streaming_split(world_size, equal=equal)
    # One actor handle: Ray's broadcast takes small values only (a list of parts repeats the handle).
    coordinator = broadcast_from_rank_zero(parts[0]._coord_actor if parts else None)
    return parts[0] if parts else StreamSplitDataIterator(coordinator, rank, world_size)


def ordered(dataset):
    """A copy of the dataset whose execution keeps block order (determinism, see module docstring)."""
    dataset = dataset.copy(dataset) if hasattr(dataset, "copy") else dataset
    dataset.context.execution_options.preserve_order = True
    dataset.context.enable_progress_bars = False
    return dataset


def sample_rows(dataset, count: int = 2) -> List[dict]:
    """The first rows (Ray pushes the limit down, so little of the pipeline runs; but an actor-pool step still
    starts its actors, so the rows are kept for the next call)."""
    try:
        cached = _SAMPLES.get(dataset, [])
    except TypeError:  # not weak-referenceable
        return _take(dataset, count)
    if len(cached) < count:
        cached = _SAMPLES[dataset] = _take(dataset, max(count, 2))
    return cached[:count]


_SAMPLES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _take(dataset, count: int) -> List[dict]:
    """`dataset.take(count)` in a task of its own, not on the driver. Once the limit is reached, Ray Data cancels
    the pipeline's tasks still running, and a cancel that crosses a task's reply aborts the process that made it
    (Ray core's check "Tried to complete task that was not pending", seen once in CI: the whole driver died).
    In a task, such an abort is a lost worker that Ray retries; the task costs about what the take does (0.1 s)."""
    import ray  # here, not at import: this module is imported where Ray's runtime is not needed

    return ray.get(_take_task().options(name="raytrainer.sample_rows").remote(dataset, count))


@functools.lru_cache(maxsize=None)
def _take_task():
    import ray

    return ray.remote(num_cpus=0, max_retries=3)(_take_rows)


def _take_rows(dataset, count: int) -> List[dict]:
    """The first rows, in block order, without Ray Data's progress bars and execution notices: this is the
    driver's look before training, and its task's output lands in the user's console (a dozen lines of bars)."""
    import logging

    data_logger = logging.getLogger("ray.data")
    level = data_logger.level
    data_logger.setLevel(logging.ERROR)
    try:
        return ordered(dataset).take(count)
    finally:
        data_logger.setLevel(level)


def make_ref(name: str, dataset, split: bool) -> RayDataRef:
    return RayDataRef(name=name, num_rows=known_row_count(dataset), sample=sample_rows(dataset, 1), split=split,
                      dataset=dataset)


@contextlib.contextmanager
def detached(trainer, order: WorkOrder) -> Iterator[Tuple[WorkOrder, Dict[str, Any]]]:
    """Replace the Ray Datasets the job reads by references while the trainer is serialised and run: a train
    order's are the trainer's (train and eval datasets, restored after), an evaluate or predict order's its own
    dataset. Yields the order to send (a copy naming the reference, or the order itself) and {name: dataset}."""
    saved = {"train_dataset": trainer.train_dataset, "eval_dataset": trainer.eval_dataset}
    datasets: Dict[str, Any] = {}

    def swap(name: str, value: Any, split: bool):
        if not is_ray_dataset(value):
            return value
        datasets[name] = value
        return make_ref(name, value, split)

    try:
        if isinstance(order, TrainOrder):
            trainer.train_dataset = swap(TRAIN, trainer.train_dataset, split=True)
            evals = trainer.eval_dataset
            if isinstance(evals, dict):
                trainer.eval_dataset = {k: swap(f"eval:{k}", v, split=False) for k, v in evals.items()}
            else:
                trainer.eval_dataset = swap("eval", evals, split=False)
        elif isinstance(order, DatasetOrder):
            dataset = swap(order.job_kind.value, order.dataset, split=False)
            if dataset is not order.dataset:
                order = dataclasses.replace(order, dataset=dataset)
        yield order, datasets
    finally:
        trainer.train_dataset, trainer.eval_dataset = saved["train_dataset"], saved["eval_dataset"]


def check_train_length(dataset, args):
    """Unknown length needs max_steps (as HF requires for an IterableDataset)."""
    if known_row_count(dataset) is None and args.max_steps <= 0:
        raise ConfigError(
            "train_dataset is a ray.data.Dataset whose length Ray does not know without running it (it has a "
            "map_batches/filter/... step): set max_steps, or call .materialize() on it first (then "
            "num_train_epochs works).")


def cpu_asks(dataset) -> Tuple[float, str]:
    """The CPUs the dataset's steps still to run need free at once besides the training workers, and a few words
    naming what asks them: its actor pools (held while the split runs: min_size actors each) plus its largest
    task. A materialized dataset (or `from_items`) has no step left but raytrainer's padding (when its length is
    known: `pad_to_multiple`)."""
    from ray.data._internal.compute import ActorPoolStrategy
    from ray.data._internal.logical.operators.all_to_all_operator import AbstractAllToAll

    pools, largest = [], (0.0, "")
    if known_row_count(dataset) is not None:
        largest = (OWN_TASK_CPUS, f"raytrainer's padding asks {OWN_TASK_CPUS:g} CPU per task")
    plan = getattr(getattr(dataset, "_logical_plan", None), "dag", None)
    seen, todo = set(), [plan] if plan is not None else []
    while todo:
        op = todo.pop()
        if id(op) in seen:
            continue
        seen.add(id(op))
        todo.extend(op.input_dependencies)
        remote_args = getattr(op, "ray_remote_args", None)
        if remote_args is None and not isinstance(op, AbstractAllToAll):
            continue  # no task of its own: in-memory input, limit, union
        cpus = float((remote_args or {}).get("num_cpus", DEFAULT_STEP_CPUS))
        compute = getattr(op, "compute", None)
        if isinstance(compute, ActorPoolStrategy):
            pools.append((cpus * compute.min_size, f"{op.name} keeps {compute.min_size} actor(s) of {cpus:g} CPU"))
        elif cpus > largest[0]:
            largest = (cpus, f"{op.name} asks {cpus:g} CPU per task")
    asks = pools + ([largest] if largest[0] else [])
    return sum(cpus for cpus, _ in asks), "; ".join(words for _, words in asks)


def pad_to_multiple(dataset, num_rows: int, world_size: int):
    """Append copies of the first rows, marked in PAD_COLUMN, so every rank of an equal split gets the same
    number of rows and none is dropped (Ray's equal split drops the remainder)."""
    missing = (-num_rows) % world_size
    if missing == 0:
        return dataset
    marked = dataset.map_batches(_mark(0), batch_format="pyarrow", num_cpus=OWN_TASK_CPUS)
    filler = dataset.limit(missing).map_batches(_mark(1), batch_format="pyarrow", num_cpus=OWN_TASK_CPUS)
    return ordered(marked.union(filler))


def _mark(value: int):
    def mark(table):
        import pyarrow as pa

        return table.append_column(PAD_COLUMN, pa.array([value] * table.num_rows, type=pa.int8()))

    return mark
