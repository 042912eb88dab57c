"""`ray.data.Dataset` input, driver side: how a Ray Dataset reaches the workers through Ray Train.

A Ray Dataset is not pickled with the trainer. The driver replaces it by a `RayDataRef` (a name, its row
count when Ray knows it without running the pipeline, and a one-row sample) and hands the dataset itself
to Ray Train (`TorchTrainer(datasets=...)`); each worker reads its part with `get_dataset_shard(name)`
(`ray_batches.py`). Preprocessing (`map_batches`) therefore runs on Ray Data's own tasks and actors.

How it is split (`ExactSplit.configure`, which runs each time Ray Train starts a worker group):

- Training data is split by streaming (`streaming_split`) with `preserve_order`: Ray's splitter then hands
  each block, in order, to the split with the fewest rows so far, so the same dataset split over the same
  number of workers gives every worker the same rows, epoch after epoch and after a restart. That is what
  makes a resume exact (each rank skips the rows of its shard it had consumed).
- When the row count is known, the dataset is padded with copies of its first rows (marked, never trained
  on) to a multiple of the world size and split with `equal=True`: every rank gets the same number of rows,
  so the epoch's length is known in advance and no row is dropped. When it is unknown (a `map_batches`
  pipeline), the split is `equal=False` (no row dropped either) and the ranks agree at every micro-step
  whether any of them still has data; one that has none trains on a zero-weight filler batch.
- Evaluation and prediction data is not split: every rank reads the whole stream and keeps every
  world-size-th batch, so the gathered predictions can be put back in dataset order.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional

from ..errors import ConfigError

# Marks the padding rows added to make the row count a multiple of the world size.
PAD_COLUMN = "__raytrainer_pad__"
TRAIN = "train"


def is_ray_dataset(obj: Any) -> bool:
    # A ray.data.Dataset exists only once ray.data is imported: asking costs no import (~1 s of CPU).
    data = sys.modules.get("ray.data")
    return data is not None and isinstance(obj, data.Dataset)


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
    # num_workers=0: there is no Ray Train, the dataset itself travels (it is a plan, not the rows).
    local: Any = None

    def iterator(self):
        if self.local is not None:
            return ordered(self.local).iterator()
        import ray.train

        return ray.train.get_dataset_shard(self.name)


def ordered(dataset):
    """A copy of the dataset whose execution keeps block order (determinism, see module docstring)."""
    dataset = dataset.copy(dataset) if hasattr(dataset, "copy") else dataset
    dataset.context.execution_options.preserve_order = True
    dataset.context.enable_progress_bars = False
    return dataset


def sample_rows(dataset, count: int = 2) -> List[dict]:
    """The first rows, computed on the driver (Ray pushes the limit down, so little of the pipeline runs;
    but an actor-pool step still starts its actors, so the rows are kept for the next call)."""
    try:
        cached = _SAMPLES.get(dataset, [])
    except TypeError:  # not weak-referenceable
        return dataset.take(count)
    if len(cached) < count:
        cached = _SAMPLES[dataset] = dataset.take(max(count, 2))
    return cached[:count]


_SAMPLES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def make_ref(name: str, dataset, split: bool, in_process: bool) -> RayDataRef:
    return RayDataRef(name=name, num_rows=known_row_count(dataset), sample=sample_rows(dataset, 1),
                      split=split, local=dataset if in_process else None)


@contextlib.contextmanager
def detached(trainer, job: dict, in_process: bool) -> Iterator[Dict[str, Any]]:
    """Replace the Ray Datasets the job reads (train, eval, the job's own dataset) by references while the
    trainer is serialised and run; yields {name: dataset} for Ray Train. The trainer is restored after."""
    saved = {"train_dataset": trainer.train_dataset, "eval_dataset": trainer.eval_dataset}
    datasets: Dict[str, Any] = {}

    def swap(name: str, value: Any, split: bool):
        if not is_ray_dataset(value):
            return value
        datasets[name] = value
        return make_ref(name, value, split, in_process)

    try:
        if job["kind"] == "train":
            trainer.train_dataset = swap(TRAIN, trainer.train_dataset, split=True)
            evals = trainer.eval_dataset
            if isinstance(evals, dict):
                trainer.eval_dataset = {k: swap(f"eval:{k}", v, split=False) for k, v in evals.items()}
            else:
                trainer.eval_dataset = swap("eval", evals, split=False)
        elif "dataset" in job:
            # The Trainer's own eval set keeps its train-time name, so the worker group that already shards
            # it (coordinator/group.py) serves this job too.
            evals = saved["eval_dataset"] if isinstance(saved["eval_dataset"], dict) else {None: saved["eval_dataset"]}
            name = next((("eval" if k is None else f"eval:{k}") for k, v in evals.items() if v is job["dataset"]),
                        job["kind"])
            job["dataset"] = swap(name, job["dataset"], split=False)
        yield datasets
    finally:
        trainer.train_dataset, trainer.eval_dataset = saved["train_dataset"], saved["eval_dataset"]


def check_train_length(dataset, args):
    """Unknown length needs max_steps (as HF requires for an IterableDataset)."""
    if known_row_count(dataset) is None and args.max_steps <= 0:
        raise ConfigError(
            "train_dataset is a ray.data.Dataset whose length Ray does not know without running it (it has a "
            "map_batches/filter/... step): set max_steps, or call .materialize() on it first (then "
            "num_train_epochs works).")


def data_config(datasets: Dict[str, Any], drop_last: bool):
    """The Ray Train `DataConfig` for our datasets (None when there is none)."""
    if not datasets:
        return None
    row_counts = {name: known_row_count(ds) for name, ds in datasets.items()}
    return _exact_split_class()(row_counts=row_counts, drop_last=drop_last)


def _exact_split_class():
    from ray.train import DataConfig

    class ExactSplit(DataConfig):
        """Ray Train's DataConfig with a deterministic split that drops no row (see module docstring)."""

        def __init__(self, row_counts: Dict[str, Optional[int]], drop_last: bool):
            super().__init__(datasets_to_split=[TRAIN], enable_shard_locality=False)
            self.row_counts = row_counts
            self.drop_last = drop_last

        def configure(self, datasets, world_size, worker_handles, worker_node_ids, **kwargs):
            output = [{} for _ in range(world_size)]
            for name, ds in datasets.items():
                ds = ordered(ds)
                if name != TRAIN:
                    for shard in output:
                        shard[name] = ds.iterator()
                    continue
                count = self.row_counts.get(name)
                equal = count is not None
                if equal and not self.drop_last:
                    ds = pad_to_multiple(ds, count, world_size)
                for shard, split in zip(output, ds.streaming_split(world_size, equal=equal)):
                    shard[name] = split
            return output

    return ExactSplit


def pad_to_multiple(dataset, num_rows: int, world_size: int):
    """Append copies of the first rows, marked in PAD_COLUMN, so every rank of an equal split gets the same
    number of rows and none is dropped (Ray's equal split drops the remainder)."""
    missing = (-num_rows) % world_size
    if missing == 0:
        return dataset
    marked = dataset.map_batches(_mark(0), batch_format="pyarrow")
    filler = dataset.limit(missing).map_batches(_mark(1), batch_format="pyarrow")
    return ordered(marked.union(filler))


def _mark(value: int):
    def mark(table):
        import pyarrow as pa

        return table.append_column(PAD_COLUMN, pa.array([value] * table.num_rows, type=pa.int8()))

    return mark
