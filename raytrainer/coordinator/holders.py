"""The worker groups this driver holds, so that a Trainer that cannot be placed is told which one holds its
resources (and how to release it) instead of waiting for ever.

A group whose Trainer was garbage-collected is released (`weakref.finalize`), without waiting. At interpreter
exit every group is released and waited for, before Ray's own exit handler disconnects: a group's fit()
thread still inside Ray while the interpreter tears Ray down crashed the driver (a segmentation fault after
a `ray job submit` script had finished its work).
"""

from __future__ import annotations

import atexit
import gc
import time
import weakref
from typing import Dict, List

from ..errors import ConfigError

_LIVE: Dict[int, "object"] = {}  # id(group) -> WorkerGroup, until released

# How long a start waits for the resources of groups just released to show as available in Ray.
RELEASE_WAIT_S = 10.0


def hold(trainer, group) -> weakref.finalize:
    """Register `group` as `trainer`'s; it is released when the trainer is collected or Python exits."""
    global _EXIT_REGISTERED
    _LIVE[id(group)] = group
    finalizer = weakref.finalize(trainer, release, group, False)
    finalizer.atexit = False  # release_all below waits at exit; the finalizer would not
    if not _EXIT_REGISTERED:
        # Registered after ray.init's own handler (a group needs Ray), so it runs before it.
        atexit.register(release_all)
        _EXIT_REGISTERED = True
    return finalizer


_EXIT_REGISTERED = False


def release(group, wait: bool = True):
    group.close(wait=wait)
    if wait:
        _LIVE.pop(id(group), None)


def release_all(wait: bool = True):
    """Close every group this driver holds (the tests do, after each test)."""
    for group in list(_LIVE.values()):
        if not group.thread_alive():
            _LIVE.pop(id(group), None)
        release(group, wait)


def check_room(need: Dict[str, float], asking: str):
    """Before a group starts: if `need` (for its minimum of workers) is not available but groups this driver
    holds take it, release those whose Trainer is gone and wait for them; if it still does not fit, fail
    naming the holders and `close()`. A shortage nobody here holds is left to Ray (an autoscaler may add
    nodes; Ray Train waits for them as before)."""
    if _fits(need) or not _LIVE:
        return
    gc.collect()  # a Trainer no longer referenced releases its group (its finalizer)
    released = [group for group in _LIVE.values() if group.closing]
    for group in released:
        group.join(RELEASE_WAIT_S)
        _LIVE.pop(id(group), None)
    deadline = time.monotonic() + (RELEASE_WAIT_S if released else 0)
    while not _fits(need) and time.monotonic() < deadline:
        time.sleep(0.2)  # Ray shows released resources as available a moment after
    holders: List[str] = [g.owner for g in _LIVE.values() if not g.closing]
    if _fits(need) or not holders:
        return
    wanted = ", ".join(f"{v:g} {k}" for k, v in sorted(need.items()))
    raise ConfigError(
        f"{asking} needs {wanted}, which the cluster has but this process's other worker group(s) hold: "
        f"{'; '.join(holders)}. Release them first with trainer.close() (or create the Trainer with "
        "`with Trainer(...) as trainer:`); an idle group also goes by itself after worker_idle_timeout_s.")


def _fits(need: Dict[str, float]) -> bool:
    import ray

    available = ray.available_resources()
    return all(available.get(name, 0.0) + 1e-9 >= amount for name, amount in need.items())
