"""How a worker process's C heap (glibc malloc) treats memory freed during a job: kept for the next step, given
back to the system between jobs.

glibc hands large freed blocks back to the system at once: a block over the mmap threshold is unmapped, and a
heap whose free top grows past the trim threshold is shrunk. A training step frees and allocates about the
same memory every step (gradients set to None, activations, the optimizer's temporaries), so each step took it
back page by page, a model's worth of minor page faults a step (benchmarks/README.md, overhead.py), where the
hand-written loop in a bare Ray Train worker, whose allocator had settled otherwise, had few. Which process
settles which way depends on what it allocated before (glibc raises its mmap threshold as it sees large blocks
freed), so one rank could run its optimizer step slower while the other waited for it in the next all-reduce.
With fixed thresholds every rank reuses its freed memory; `release_memory` (entry.py) returns it between jobs,
when an idle group should hold none (`malloc_trim`).

Linux with glibc only; elsewhere both calls do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from typing import Optional

# mallopt parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
# The largest mmap threshold mallopt accepts on 64-bit glibc (HEAP_MAX_SIZE / 2): blocks below it come from the
# heap and are reused. Larger blocks (a large model's flat buffers) are still mapped and unmapped each time.
MMAP_THRESHOLD = 32 << 20
# Free memory at the top of a heap kept for reuse rather than given back.
TRIM_THRESHOLD = 1 << 30


@functools.lru_cache(maxsize=1)
def _glibc() -> Optional[ctypes.CDLL]:
    # Looked up once per process: find_library runs `ldconfig -p`, and release_memory calls this every job.
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


def keep_freed_memory() -> bool:
    """Fixed thresholds for this process (once, as a worker starts); True if they were set."""
    libc = _glibc()
    if libc is None:
        return False
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD,
                                                                                      TRIM_THRESHOLD))


def give_back_freed_memory() -> None:
    """Return the free memory of every heap to the system (between jobs)."""
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)
