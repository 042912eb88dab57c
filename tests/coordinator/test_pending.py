"""The driver's word on a wait that Ray cannot end (coordinator/pending.py): which demands fit on no node's free
resources, when the watch looks (only after QUIET_S without progress; it speaks after 3 looks that saw the same,
once per quiet spell), and Ray's own pending demands read from the GCS (a placement group that cannot be placed,
on the session's Ray)."""

from __future__ import annotations

import time

import pytest

from raytrainer.coordinator.pending import QUIET_S, ClusterView, Demand, PendingWatch, _shape, read_cluster

TASK = Demand((("CPU", 1.0),), 3)
SMALL = Demand((("CPU", 0.25),), 1)
GROUP = Demand((), 1, ((("CPU", 1.0),), (("CPU", 1.0),)))


def view(*demands, free=({"CPU": 0.5}, {"CPU": 0.75})):
    return ClusterView(tuple(demands), tuple(free), {"CPU": 4.0})


def test_unplaceable_is_what_fits_on_no_node_now():
    assert view(TASK, SMALL).unplaceable() == [TASK]
    assert view(GROUP).unplaceable() == [GROUP]  # each bundle needs a node with a whole CPU free
    assert view(TASK, GROUP, free=({"CPU": 1.0}, {"CPU": 1.0})).unplaceable() == []
    assert view(TASK, GROUP, free=({"CPU": 0.5}, {"CPU": 1.0})).unplaceable() == [GROUP]  # all bundles at once
    assert view(TASK, free=({"CPU": 4.0, "GPU": 0.0},)).unplaceable() == []
    assert view(Demand((("CPU", 1.0), ("GPU", 1.0)), 1), free=({"CPU": 4.0},)).unplaceable()


def test_a_placement_groups_own_resources_and_node_ids_are_not_what_a_task_asks():
    node = {"CPU": 0.5, "CPU_group_0_abc": 0.75, "CPU_group_abc": 1.5, "bundle_group_abc": 999.9,
            "node:10.0.0.1": 1.0, "memory": 1e9, "object_store_memory": 1e9, "GPU": 1.0, "accel": 2.0}
    assert dict(_shape(node)) == {"CPU": 0.5, "GPU": 1.0, "accel": 2.0}


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def watch_of(views):
    """A watch on a fake clock whose reads return `views` in turn; returns (watch, clock, reads, reports)."""
    clock, reads, reports = Clock(), [], []

    def read():
        reads.append(clock.now)
        return views[min(len(reads), len(views)) - 1]

    return PendingWatch(read=read, report=reports.append, clock=clock), clock, reads, reports


def test_told_once_when_three_looks_without_progress_see_the_same_and_again_after_progress():
    watch, clock, reads, reports = watch_of([view(TASK)])
    for t in range(0, int(QUIET_S)):  # quiet, but not long enough: Ray is not even asked
        clock.now = t
        watch.look()
    assert reads == [] and reports == []
    clock.now = QUIET_S
    watch.look()  # first look: stuck, but maybe only queued
    assert len(reads) == 1 and reports == []
    clock.now = QUIET_S + 1
    watch.look()  # too soon for another look
    assert len(reads) == 1
    for t in (QUIET_S + 5, QUIET_S + 10):
        clock.now = t
        watch.look()
    [report] = reports
    assert report.startswith(f"[raytrainer] no progress for {QUIET_S + 10:.0f} s, and Ray holds what it cannot "
                             "place: 3 task(s) or actor(s) asking {'CPU': 1} each. Free now: {'CPU': 0.75} at most "
                             "on one node (of {'CPU': 4} in the cluster).")
    assert "resources_per_worker" in report and "num_cpus=0.5" in report and "worker group waits" not in report
    clock.now = QUIET_S + 30
    watch.look()
    assert len(reports) == 1  # once per quiet spell
    watch.progress()
    for _ in range(3):
        clock.now += QUIET_S
        watch.look()
    assert len(reports) == 2


def test_a_wait_that_changes_between_looks_is_not_told():
    """A queue that moves (its count, what is free) is a pipeline at work; only a wait the same at 3 looks is told."""
    fewer = Demand(TASK.shape, 2)
    views = [view(TASK), view(fewer), view(TASK, free=({"CPU": 0.5},)), view(SMALL), view(GROUP), view(GROUP),
             view(GROUP)]
    watch, clock, reads, reports = watch_of(views)
    for look in range(len(views) - 1):
        clock.now = QUIET_S + 5 * look
        watch.look()
    assert len(reads) == len(views) - 1 and reports == []
    clock.now += 5
    watch.look()
    [report] = reports
    assert "a placement group of 2 bundle(s) {'CPU': 1} (a worker group)" in report
    assert "close() the Trainers" in report


def test_a_stall_report_is_told_its_cause_at_once():
    watch, clock, reads, reports = watch_of([view(), view(TASK)])
    watch.on_stall()  # nothing Ray cannot place: nothing to add to the watchdog's line
    watch.on_stall()
    assert len(reads) == 2 and len(reports) == 1 and "asking {'CPU': 1}" in reports[0]


def test_read_cluster_sees_a_placement_group_that_cannot_be_placed(ray_session):
    from ray.util.placement_group import placement_group, remove_placement_group

    assert read_cluster() is not None
    bundles = [{"CPU": 5.0}, {"CPU": 5.0}]  # the session's Ray has 6 CPUs on its one node
    group = placement_group(bundles, strategy="PACK")
    try:
        for _ in range(50):
            seen = read_cluster()
            stuck = [d for d in seen.unplaceable() if d.gang == ((("CPU", 5.0),), (("CPU", 5.0),))]
            if stuck:
                break
            time.sleep(0.1)
        assert stuck, seen
        assert seen.total["CPU"] == pytest.approx(6.0)
    finally:
        remove_placement_group(group)
