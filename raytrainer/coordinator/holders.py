"""The worker groups of this driver process: one pool that every Trainer draws from.

A group belongs to the process, not to the Trainer that started it. A call takes an idle group whose shape
fits (`WorkerGroup.reuses`), whichever Trainer started it: a script that builds Trainer after Trainer (a
notebook, a hyperparameter loop, DDP then FSDP) pays one group start, not one per Trainer. A call that needs a
new group first releases the idle groups that hold what it needs; only a group running a job (`busy`, another
thread's call) makes it fail, naming that group's Trainer and `close()`.

Groups go on `close()` of the Trainer that used one last, when leaving `with Trainer(...)`, after
worker_idle_timeout_s without a job, and at interpreter exit: every group is released and waited for before
Ray's own exit handler disconnects (a group's fit() thread still inside Ray while the interpreter tears Ray
down crashed the driver: a segmentation fault after a `ray job submit` script had finished its work).
"""

from __future__ import annotations

import atexit
import time
import weakref
from typing import Callable, Dict, List, Optional

from ..errors import ConfigError

_LIVE: Dict[int, "object"] = {}  # id(group) -> WorkerGroup, until released

# How long a start waits for the resources of groups just released to show as available in Ray.
RELEASE_WAIT_S = 10.0
# How long Ray may take to show the resources of a group whose release was already waited for (its placement
# group is gone; the available view follows within a moment).
ENDED_SETTLE_S = 2.0
_EXIT_REGISTERED = False


def hold(group):
    """Put a new group into the pool; every group is released at exit."""
    global _EXIT_REGISTERED
    _LIVE[id(group)] = group
    if not _EXIT_REGISTERED:
        # Registered after ray.init's own handler (a group needs Ray), so it runs before it.
        atexit.register(_release_at_exit)
        _EXIT_REGISTERED = True


def take_idle(spec, prefer=None):
    """An idle live group that can run a job on `spec` (`prefer` first: the caller's last group); None if there
    is none."""
    _drop_gone()
    candidates = ([prefer] if prefer is not None else []) + [g for g in _LIVE.values() if g is not prefer]
    for group in candidates:
        if id(group) in _LIVE and group.alive and not group.busy and group.reuses(spec):
            return group
    return None


def release(group, wait: bool = True):
    group.close(wait=wait)
    if wait:
        _LIVE.pop(id(group), None)


def release_all(wait: bool = True):
    """Close every group of this process (the tests do, after each test)."""
    for group in list(_LIVE.values()):
        if not group.thread_alive():
            _LIVE.pop(id(group), None)
        release(group, wait)


def _release_at_exit():
    """At exit no call runs on a group any more and Ray is about to go (an embedded one) or to end this
    driver's actors (a cluster): stop each group's controller (its workers and placement group go with it)
    and sink at once instead of Ray Train's graceful shutdown, which every script's exit waited for. A Ray this
    process started goes next, with everything in it: its groups skip even Ray Train's abort (which cancels the
    group's autoscaling request and removes its placement group): `raytrainer launch` on its own Ray ended in
    2.8-3.1 s after the last step instead of 3.9-4.4 s (3 runs each, 2 cores)."""
    from .cluster import started_here

    ours = bool(_LIVE) and started_here()
    for group in list(_LIVE.values()):
        group.stop_now(graceful=not ours)
    _LIVE.clear()


def check_room(need: Dict[str, float], asking: str):
    """Before a group starts: if `need` (for its minimum of workers) is not available, wait for the groups
    already ending, then release the idle groups of this process (they would be of another shape: one that
    fits is reused instead) and wait for their resources; if a busy group still takes what is needed, fail at
    once naming its Trainer and `close()`. A shortage nobody here holds is left to Ray (an autoscaler may add
    nodes; Ray Train waits for them as before)."""
    _drop_gone()
    if _fits(need) or not _LIVE:
        return
    # Groups already on their way out (a close() that did not wait) give their resources back by themselves:
    # wait for them before releasing an idle group that a later call could take.
    ending = [group for group in _LIVE.values() if group.closing and not group.busy]
    for group in ending:
        release(group, wait=True)
    if ending and _wait_until(lambda: _fits(need), ENDED_SETTLE_S):
        return
    before = _available()
    idle = [group for group in _LIVE.values() if not group.busy]
    for group in idle:
        release(group, wait=True)
    # Wait until the need fits or everything the released groups held shows as available again (Ray shows
    # it a moment after): then only the busy groups can make the call wait, and it fails at once.
    held: Dict[str, float] = {}
    for group in idle:
        for name, amount in group.holds.items():
            held[name] = held.get(name, 0.0) + amount
    returned = {name: before.get(name, 0.0) + amount for name, amount in held.items()}
    if idle:
        _wait_until(lambda: _fits(need) or bool(returned and _fits(returned)), RELEASE_WAIT_S)
    holders: List[str] = [g.owner for g in _LIVE.values() if not g.closing]
    if _fits(need) or not holders:
        return
    wanted = ", ".join(f"{v:g} {k}" for k, v in sorted(need.items()))
    raise ConfigError(
        f"{asking} needs {wanted}, which the cluster has but this process's other worker group(s) hold while "
        f"they run a job: {'; '.join(holders)}. Wait for that call to return, or release its group first with "
        "trainer.close() (or `with Trainer(...) as trainer:`).")


def live_groups() -> List[object]:
    """Every group of the pool, idle, busy or ending (for tests and benchmarks); those whose fit() thread
    ended are dropped from the pool."""
    _drop_gone()
    for key, group in list(_LIVE.items()):
        if not group.thread_alive():
            _LIVE.pop(key, None)
    return list(_LIVE.values())


def _drop_gone():
    """Forget the groups of a Ray this process is no longer connected to (ray.shutdown(), then ray.init()
    again): their actors went with that Ray, and they hold nothing in this one. (A group whose fit() thread
    ended stays until released: its close() removes its sink.)"""
    for key, group in list(_LIVE.items()):
        if not group.of_this_ray():
            group.closing = True  # its Trainer's next call starts a new group, and its close() has nothing to do
            _LIVE.pop(key, None)


def idle_groups() -> List[object]:
    """The live groups not running a job (for tests and benchmarks)."""
    return [g for g in _LIVE.values() if g.alive and not g.busy]


def _wait_until(done: Callable[[], bool], limit_s: float) -> bool:
    """Poll `done` until it holds or `limit_s` passed; whether it holds."""
    deadline = time.monotonic() + limit_s
    while not done():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)
    return True


def _available() -> Dict[str, float]:
    import ray

    return ray.available_resources()


def _fits(need: Dict[str, float]) -> bool:
    available = _available()
    return all(available.get(name, 0.0) + 1e-9 >= amount for name, amount in need.items())


def user_of(group) -> Optional["PoolUser"]:
    """The `PoolUser` (of a Trainer) whose call used `group` last (a weak reference: the pool keeps no Trainer
    alive)."""
    ref = getattr(group, "user", None)
    return ref() if ref is not None else None


class PoolUser:
    """A Trainer as a user of this process's pool: the group its last call used (taken first by its next call;
    released by its `close()`), and how the groups it starts name it (`owner`: "the Trainer created at
    file:line", in the error another call gets while this one's group holds what it needs). The Trainer holds
    one and hands it to `dispatch.dispatch_job`: the coordinator reads and records nothing else of the Trainer."""

    def __init__(self, owner: str):
        self.owner = owner
        self.group = None  # a WorkerGroup, once a call ran on one

    def use(self, group):
        """`group` runs this user's call: its last group now, and released by its close()."""
        group.user = weakref.ref(self)
        self.group = group

    def release(self):
        """Release the last group now, unless another user's call took it since."""
        if self.group is not None:
            if user_of(self.group) in (self, None):
                release(self.group)
            self.group = None
