"""ProfilerCallback: torch.profiler over optimizer steps start..end on every rank.

    Trainer(..., callbacks=[ProfilerCallback(start_step=5, end_step=7)])

Each rank writes, under `output_dir/profile/steps_{start}-{end}/` (local or a URL such as s3://):
- `rank{r}.trace.json`: a Chrome trace (chrome://tracing, https://ui.perfetto.dev);
- `rank{r}.summary.txt`: the top operators (`key_averages().table`); rank 0 also prints its table, which
  Ray forwards to the driver's console;
- `rank{r}.memory.pickle` with `memory_snapshot=True`, on GPUs only: a CUDA memory snapshot for
  https://pytorch.org/memory_viz. A CPU rank writes none and says so once.

It runs inside the loop on every rank (`on_every_rank`) and never changes control, so the driver is not
consulted. Steps are numbered as `state.global_step` after they finish (the first step is 1); a run that
ends inside the range writes what it profiled. The files go to a local directory first (torch writes files)
and are then uploaded through fsspec when output_dir is a URL.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from typing import Optional

import torch

from .. import storage
from ..storage.upload import upload_file
from .base import TrainerCallback

SNAPSHOT_ENTRIES = 100_000  # allocation events kept by the CUDA memory history (torch's documented example)


class ProfilerCallback(TrainerCallback):
    on_every_rank = True
    observes_only = True

    def __init__(self, start_step: int = 1, end_step: Optional[int] = None, memory_snapshot: bool = False,
                 record_shapes: bool = True, profile_memory: bool = False, with_stack: bool = False,
                 row_limit: int = 20):
        end_step = start_step if end_step is None else end_step
        if not (isinstance(start_step, int) and isinstance(end_step, int) and 1 <= start_step <= end_step):
            raise ValueError(f"ProfilerCallback(start_step={start_step!r}, end_step={end_step!r}): give optimizer "
                             "steps with 1 <= start_step <= end_step (the first step is 1).")
        self.start_step, self.end_step = start_step, end_step
        self.memory_snapshot = memory_snapshot
        self.options = dict(record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack)
        self.row_limit = row_limit
        self._profile = None
        self._first = None  # the first step profiled (a resumed run may start inside the range)
        self._snapshot = False
        self._done = False

    def __getstate__(self):  # travels to the workers before any profile exists
        return {**self.__dict__, "_profile": None}

    def on_train_begin(self, args, state, control, **kwargs):
        self._done = False  # each train() call profiles its range (in process the same object serves them all)

    def on_step_begin(self, args, state, control, **kwargs):
        step = state.global_step + 1  # the step about to run
        if self._done or self._profile is not None or not self.start_step <= step <= self.end_step:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._start_snapshot()
        self._profile = torch.profiler.profile(activities=activities, **self.options)
        self._profile.start()
        self._first = step

    def on_step_end(self, args, state, control, **kwargs):
        if self._profile is not None and state.global_step >= self.end_step:
            self._finish(args, state.global_step)

    def on_train_end(self, args, state, control, **kwargs):
        if self._profile is not None:  # the run ended inside the range
            self._finish(args, state.global_step)

    # ------------------------------------------------------------------ internals
    def _start_snapshot(self):
        if not self.memory_snapshot:
            return
        if not torch.cuda.is_available():
            warnings.warn(f"ProfilerCallback(memory_snapshot=True): CUDA memory snapshots are GPU-only; rank "
                          f"{_rank()} runs on CPU and writes no snapshot (the trace is written).", stacklevel=2)
            return
        torch.cuda.memory._record_memory_history(max_entries=SNAPSHOT_ENTRIES)
        self._snapshot = True

    def _finish(self, args, last_step: int):
        profile, self._profile, self._done = self._profile, None, True
        profile.stop()
        rank = _rank()
        target = storage.join(args.output_dir, "profile", f"steps_{self._first}-{last_step}")
        cuda = any(a == torch.profiler.ProfilerActivity.CUDA for a in profile.activities)
        table = profile.key_averages().table(sort_by="self_device_time_total" if cuda else "self_cpu_time_total",
                                             row_limit=self.row_limit)
        local = storage.is_local(target)
        folder = storage.local_path(target) if local else tempfile.mkdtemp(prefix="raytrainer-profile-")
        try:
            os.makedirs(folder, exist_ok=True)
            names = [f"rank{rank}.trace.json", f"rank{rank}.summary.txt"]
            profile.export_chrome_trace(os.path.join(folder, names[0]))
            with open(os.path.join(folder, names[1]), "w") as f:
                f.write(table)
            if self._snapshot:
                names.append(f"rank{rank}.memory.pickle")
                torch.cuda.memory._dump_snapshot(os.path.join(folder, names[-1]))
                torch.cuda.memory._record_memory_history(enabled=None)
                self._snapshot = False
            if not local:
                for name in names:
                    upload_file(os.path.join(folder, name), storage.join(target, name), args.storage_options)
        finally:
            if not local:
                shutil.rmtree(folder, ignore_errors=True)
        if rank == 0:
            print(f"[raytrainer] profile of steps {self._first}-{last_step} (rank 0; every rank's trace in "
                  f"{target}):\n{table}", flush=True)


def _rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
