"""The pool's rule for making room (coordinator/holders.check_room), without Ray: a fake cluster whose free
resources grow when a fake group is released, a moment later as in Ray."""

from __future__ import annotations

import threading
import time

import pytest

from raytrainer.coordinator import holders
from raytrainer.errors import ConfigError


class FakeCluster:
    def __init__(self, cpus: float, lag_s: float = 0.0):
        self.cpus, self.lag_s = cpus, lag_s
        self.instance = "ray-1"  # the Ray the process is connected to now (ray.shutdown() + ray.init(): another)
        self.lock = threading.Lock()

    def available(self):
        with self.lock:
            return {"CPU": self.cpus} if self.cpus else {}  # as Ray: a resource with none free is absent

    def give_back(self, cpus: float):
        def later():
            time.sleep(self.lag_s)
            with self.lock:
                self.cpus += cpus
        threading.Thread(target=later, daemon=True).start()


class FakeGroup:
    def __init__(self, cluster: FakeCluster, cpus: float, busy: bool, owner: str):
        self.cluster, self.holds, self.busy, self.owner = cluster, {"CPU": cpus}, busy, owner
        self.closing, self.closed, self.instance = False, False, cluster.instance

    def close(self, wait: bool = True):
        self.closing = self.closed = True
        self.cluster.give_back(self.holds["CPU"])

    def stop_now(self, graceful: bool = True):
        self.closing, self.stopped = True, "gracefully" if graceful else "at once"

    def thread_alive(self) -> bool:
        return True

    def of_this_ray(self) -> bool:
        return self.instance == self.cluster.instance

    @property
    def alive(self) -> bool:
        return not self.closing and self.of_this_ray()

    def reuses(self, spec) -> bool:
        return True


@pytest.fixture
def pool(monkeypatch):
    def make(free: float, lag_s: float, *groups):
        cluster = FakeCluster(free, lag_s)
        monkeypatch.setattr(holders, "_available", cluster.available)
        live = {}
        for cpus, busy, owner in groups:
            group = FakeGroup(cluster, cpus, busy, owner)
            live[id(group)] = group
        monkeypatch.setattr(holders, "_LIVE", live)
        return live
    return make


def test_released_idle_groups_make_room_once_ray_shows_their_resources(pool):
    live = pool(0, 0.5, (2, False, "idle A"))
    holders.check_room({"CPU": 2}, "train() with 2 workers")
    assert live == {}  # released and dropped from the pool


def test_a_busy_group_refuses_at_once_when_the_released_ones_are_back(pool):
    """What the busy group holds cannot come back while its job runs: no waiting out RELEASE_WAIT_S."""
    pool(1, 0.3, (1, False, "idle A"), (3, True, "the Trainer created at busy.py:7"))
    started = time.monotonic()
    with pytest.raises(ConfigError, match=r"needs 3 CPU.*while they run a job: the Trainer created at busy.py:7"):
        holders.check_room({"CPU": 3}, "train() with 3 workers")
    assert time.monotonic() - started < holders.RELEASE_WAIT_S / 2


def test_no_idle_group_to_release_refuses_without_waiting(pool):
    pool(0, 0, (2, True, "the Trainer created at busy.py:7"))
    started = time.monotonic()
    with pytest.raises(ConfigError, match="busy.py:7"):
        holders.check_room({"CPU": 1}, "evaluate() with 1 workers")
    assert time.monotonic() - started < 1.0


def test_a_group_on_its_way_out_is_waited_for_before_an_idle_one_is_released(pool):
    """A close() that did not wait (a test's teardown, a Trainer's garbage collection): its resources come back
    by themselves, and the idle group stays for a later call that fits it."""
    live = pool(1, 0.3, (2, False, "idle A"), (2, False, "ending B"))
    idle, ending = live.values()
    ending.closing = True
    holders.check_room({"CPU": 3}, "train() with 3 workers")
    assert list(live.values()) == [idle] and not idle.closing


def test_enough_free_resources_release_nothing(pool):
    live = pool(4, 0, (2, False, "idle A"))
    holders.check_room({"CPU": 2}, "train() with 2 workers")
    assert [g.closing for g in live.values()] == [False]


def test_a_new_group_names_what_changed_in_its_shape():
    from raytrainer.coordinator.group import GroupSpec

    old = GroupSpec(num_workers=2, resources_per_worker=(), use_gpu=False, elastic_resize_monitor_interval_s=None,
                    max_preemptions=-1, worker_idle_timeout_s=2, ray_train_log_level="WARNING")
    new = GroupSpec(num_workers=1, resources_per_worker=(), use_gpu=False, elastic_resize_monitor_interval_s=None,
                    max_preemptions=-1, worker_idle_timeout_s=0, ray_train_log_level="WARNING")
    assert "; ".join(old.changes_to(new)) == "num_workers 2 -> 1; worker_idle_timeout_s 2 -> 0"


def test_groups_of_a_ray_that_was_shut_down_are_forgotten_not_reused_or_waited_for(pool):
    """ray.shutdown(), then ray.init() again (a notebook, a benchmark between its rounds): the pool's groups
    lived in the old Ray. None is taken, none is closed (a call into the old Ray's actors would fail or wait),
    and what they held counts for nothing in the new one."""
    live = pool(2, 0.5, (2, False, "idle A"), (2, True, "busy B"))
    cluster = next(iter(live.values())).cluster
    assert holders.take_idle(spec=None) is not None  # the same Ray: the idle group is taken
    cluster.instance = "ray-2"
    groups = list(live.values())
    assert holders.take_idle(spec=None) is None
    holders.check_room({"CPU": 2}, "train() with 2 workers")
    assert live == {} and all(g.closing and not g.closed for g in groups)


def test_a_trainers_close_releases_its_last_group_unless_another_trainer_used_it_since(pool):
    """`PoolUser`: what the coordinator keeps of a Trainer. A group another Trainer's call took since stays in
    the pool for that one; either way the Trainer forgets it."""
    live = pool(4, 0, (2, False, "idle A"), (2, False, "idle B"))
    a, b = live.values()
    first, second = holders.PoolUser("the Trainer created at a.py:1"), holders.PoolUser("the Trainer created at b.py:2")
    first.use(a)
    first.use(b)
    second.use(b)  # b taken by the second Trainer's call
    assert holders.user_of(b) is second and first.group is b
    first.release()
    assert first.group is None and not b.closing  # not its group any more
    first.use(a)
    first.release()
    assert a.closed and first.group is None
    del second
    import gc

    gc.collect()
    assert holders.user_of(b) is None  # the pool keeps no Trainer alive


@pytest.mark.parametrize("ray_started_here, how", [(True, "at once"), (False, "gracefully")])
def test_at_exit_every_group_stops_and_only_on_a_ray_that_goes_with_this_process_without_ray_trains_abort(
        pool, monkeypatch, ray_started_here, how):
    """Ray's own exit handler shuts a Ray this process started down next, with every actor and placement group in
    it: Ray Train's abort (its autoscaling request cancelled, its placement group removed; ~1 s of a launch's
    exit) is for a cluster, which stays."""
    from raytrainer.coordinator import cluster

    live = pool(0, 0, (2, False, "idle A"), (2, True, "the Trainer created at busy.py:7"))
    groups = list(live.values())
    monkeypatch.setattr(cluster, "started_here", lambda: ray_started_here)
    holders._release_at_exit()
    assert [group.stopped for group in groups] == [how, how] and live == {}
