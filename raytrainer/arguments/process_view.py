"""`DriverView`, the mixin of `TrainingArguments` that holds transformers' process properties (`should_log`,
`process_index`, `device`, ...), answered for a run whose training processes are Ray workers.

transformers' scripts ask them in the process that trains. Here the script runs in the driver, which trains
nothing: it is the run's main process (process_index 0, should_log and should_save True, and
`main_process_first()` has no one to wait for), and the properties about hardware describe the workers:
`world_size` is the number of workers (the most of an elastic range), `device` and `n_gpu` what each worker
trains on. Inside a worker (a torch.distributed process group is up) the same properties describe that
worker, as they do in a transformers process.
"""

from __future__ import annotations

import contextlib
import logging
import os
from datetime import timedelta
from typing import Any, Dict

from ..verbosity import LOG_LEVELS, PASSIVE


def _group():
    """torch.distributed when this process is a worker of a run (a process group is up), else None."""
    import torch.distributed as dist

    return dist if dist.is_available() and dist.is_initialized() else None


def parallel_mode_enum():
    """transformers' ParallelMode when transformers is installed (scripts compare with it), else ours."""
    try:
        from transformers.training_args import ParallelMode
    except ImportError:
        import enum

        ParallelMode = enum.Enum("ParallelMode", {"NOT_PARALLEL": "not_parallel", "DISTRIBUTED": "distributed"})
    return ParallelMode


class DriverView:
    """Mixed into `TrainingArguments`; reads its num_workers, use_gpu, log levels and batch sizes."""

    @property
    def process_index(self) -> int:
        group = _group()
        return group.get_rank() if group else 0

    @property
    def local_process_index(self) -> int:
        return int(os.environ.get("LOCAL_RANK", 0)) if _group() else 0

    @property
    def world_size(self) -> int:
        """The number of training processes: the workers (an elastic range's most), 1 for num_workers=0."""
        group = _group()
        return group.get_world_size() if group else max(self.max_workers, 1)

    @property
    def should_log(self) -> bool:
        if not _group():
            return True  # the driver prints the run's logs
        return (self.local_process_index if self.log_on_each_node else self.process_index) == 0

    @property
    def should_save(self) -> bool:
        return self.process_index == 0  # save_on_each_node is refused: one storage URL for the whole run

    def get_process_log_level(self) -> int:
        """log_level for the main process, log_level_replica for the others; 'passive' is the level the
        transformers logger has (WARNING when transformers is not installed), as in transformers."""
        name = self.log_level if self.should_log else self.log_level_replica
        if name != PASSIVE:
            return LOG_LEVELS[name]
        try:
            from transformers.utils import logging as hf_logging
        except ImportError:
            return logging.WARNING
        return hf_logging.get_verbosity()

    @contextlib.contextmanager
    def main_process_first(self, local: bool = True, desc: str = "work"):
        """transformers' barrier around work the main process does first (dataset `map` caching). The
        driver is the only process of the script, so there is nothing to wait for."""
        yield

    @property
    def device(self):
        """The device a worker trains on: cuda when the workers have GPUs, else cpu. use_gpu=None (GPUs if the
        cluster has them) is answered from this machine's GPUs; num_workers=0 trains here, on cuda only with
        use_gpu=True."""
        import torch

        group = _group()
        if group:
            cuda = group.get_backend() == "nccl"
            return torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
        if self.use_gpu is None:
            cuda = self.max_workers > 0 and torch.cuda.is_available()
        else:
            cuda = bool(self.use_gpu) and (self.max_workers > 0 or torch.cuda.is_available())
        return torch.device("cuda") if cuda else torch.device("cpu")

    @property
    def n_gpu(self) -> int:
        """GPUs per training process: 1 on GPU workers, else 0 (transformers' value under DDP)."""
        return 1 if self.device.type == "cuda" else 0

    @property
    def parallel_mode(self):
        ParallelMode = parallel_mode_enum()
        return ParallelMode.DISTRIBUTED if self.world_size > 1 else ParallelMode.NOT_PARALLEL

    @property
    def train_batch_size(self) -> int:
        """transformers' per-process training batch (per_device x max(1, n_gpu), and n_gpu is at most 1)."""
        return self.per_device_train_batch_size

    @property
    def eval_batch_size(self) -> int:
        return self.per_device_eval_batch_size

    @property
    def ddp_timeout_delta(self) -> timedelta:
        return timedelta(seconds=self.ddp_timeout)

    @property
    def place_model_on_device(self):
        return None  # transformers' hook for integrations; the workers place the model

    def to_sanitized_dict(self) -> Dict[str, Any]:
        """The arguments as TensorBoard's hparams take them (transformers' method)."""
        d = {**self.to_dict(), "train_batch_size": self.train_batch_size, "eval_batch_size": self.eval_batch_size}
        return {k: v if type(v) in (bool, int, float, str) else str(v) for k, v in d.items()}
