"""Why a job waits: what Ray holds that it cannot place, told on the driver within half a minute.

A job that waits on Ray has no error to raise: a Ray Data task asking a CPU the training workers hold waits
forever, and so does a worker group whose placement group needs CPUs another group holds. Before this, the
only sign was the hang watchdog's line after `hang_warning_s` (300 s): "no progress in loading the next batch",
true but naming neither cause nor fix. The driver's pump (`pump.py`) tells this watch whenever the job makes
progress; after `QUIET_S` without any (10 s), it reads Ray's pending demands from the GCS (what `ray status` shows
as "Pending Demands": no state API, no dashboard, about a millisecond) every `LOOK_EVERY_S`, and when demands that
fit on no node's free resources are there, unchanged with what is free, at `LOOKS` looks in a row (10 s), it
prints one warning: what is pending, what is free, the fix. Once per quiet spell: progress starts a new one.

The demands are the cluster's, not only this job's (Ray does not say whose): on a shared cluster the warning says
so. An autoscaling cluster places them when its nodes come: the warning then is an early word, not an error.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

# No progress for this long before Ray's pending demands are looked at (LOOKS times, LOOK_EVERY_S apart): a slow step
# or a group start is no stall, and a demand pending a moment (a Ray Data task queued behind the others) is normal.
QUIET_S = 10.0
LOOK_EVERY_S = 5.0
LOOKS = 3  # the same stuck demands and free resources at this many looks in a row: told (at QUIET_S + 10 s)
# Resources of a node that are bookkeeping, not what a task or actor asks (node ids, a placement group's own).
_BOOKKEEPING = ("node:", "bundle_group_", "object_store_memory", "memory")


@dataclass(frozen=True)
class Demand:
    """`count` tasks or actors asking `shape` each, or (gang) one placement group of these bundles."""
    shape: Tuple[Tuple[str, float], ...]
    count: int
    gang: Tuple[Tuple[Tuple[str, float], ...], ...] = ()

    def describe(self) -> str:
        if self.gang:
            return f"a placement group of {len(self.gang)} bundle(s) {_shapes(self.gang)} (a worker group)"
        return f"{self.count} task(s) or actor(s) asking {_text(dict(self.shape))} each"


@dataclass(frozen=True)
class ClusterView:
    """Ray's pending demands, and each alive node's free and total resources, at one moment."""
    demands: Tuple[Demand, ...]
    free: Tuple[Dict[str, float], ...]
    total: Dict[str, float] = field(default_factory=dict)

    def unplaceable(self) -> List[Demand]:
        """The demands that fit on no node's free resources now: a task or actor (one of them), or a placement
        group (all its bundles at once, each on some node: first fit, largest first)."""
        return [d for d in self.demands if not _fit_all(d.gang or (d.shape,), self.free)]

    def most_free(self) -> Dict[str, float]:
        """The most of each resource any one node has free."""
        most: Dict[str, float] = {}
        for node in self.free:
            for name, amount in node.items():
                most[name] = max(most.get(name, 0.0), amount)
        return most


def _fit_all(bundles, free) -> bool:
    left = [dict(node) for node in free]
    for bundle in sorted(bundles, key=lambda b: -sum(amount for _, amount in b)):
        node = next((n for n in left if all(n.get(name, 0.0) >= amount for name, amount in bundle)), None)
        if node is None:
            return False
        for name, amount in bundle:
            node[name] -= amount
    return True


def read_cluster() -> Optional[ClusterView]:
    """Ray's pending demands and free resources from the GCS; None without Ray or when it does not answer (a
    diagnosis never fails a run)."""
    try:
        import ray
        from ray._raylet import GcsClient
        from ray.autoscaler.v2.sdk import get_cluster_resource_state

        if not ray.is_initialized():
            return None
        state = get_cluster_resource_state(GcsClient(address=ray.get_runtime_context().gcs_address))
    except Exception:  # noqa: BLE001 (a Ray Client driver, an old Ray, a GCS that does not answer)
        return None
    demands = [Demand(_shape(r.request.resources_bundle), r.count) for r in state.pending_resource_requests]
    demands += [Demand((), 1, tuple(_shape(b.resources_bundle) for b in g.requests))
                for g in state.pending_gang_resource_requests]
    from ray.core.generated.autoscaler_pb2 import NodeStatus

    alive = [node for node in state.node_states if node.status != NodeStatus.DEAD]
    total: Dict[str, float] = {}
    for node in alive:
        for name, amount in _shape(node.total_resources):
            total[name] = total.get(name, 0.0) + amount
    return ClusterView(tuple(d for d in demands if d.shape or d.gang),
                       tuple(dict(_shape(node.available_resources)) for node in alive), total)


def _shape(resources) -> Tuple[Tuple[str, float], ...]:
    """The resources a task asks, without Ray's bookkeeping; a placement group's `CPU_group_<id>` is its CPU."""
    shape: Dict[str, float] = {}
    for name, amount in dict(resources).items():
        if amount <= 0 or name.startswith(_BOOKKEEPING):
            continue
        base = name.split("_group_")[0]
        if base != name:
            continue  # held inside a placement group: not free for anything outside it
        shape[base] = amount
    return tuple(sorted(shape.items()))


def _text(resources: Dict[str, float]) -> str:
    return "{" + ", ".join(f"'{name}': {amount:g}" for name, amount in sorted(resources.items())) + "}"


def _shapes(bundles) -> str:
    return ", ".join(_text(dict(bundle)) for bundle in dict.fromkeys(bundles))


def describe(stuck: List[Demand], view: ClusterView, quiet_s: float) -> str:
    """The warning: what waits, what is free, the fix (a Ray Data step's, or a worker group's)."""
    asked = {name for d in stuck for bundle in (d.gang or (d.shape,)) for name, _ in bundle}
    free = {k: v for k, v in view.most_free().items() if k in asked | {"CPU", "GPU"}}
    total = {k: v for k, v in view.total.items() if k in free}
    lines = [f"[raytrainer] no progress for {quiet_s:.0f} s, and Ray holds what it cannot place: "
             + "; ".join(d.describe() for d in stuck)
             + f". Free now: {_text(free)} at most on one node (of {_text(total)} in the cluster)."]
    if any(not d.gang for d in stuck):
        lines.append("  Ray Data's tasks and actors (map_batches, reads; 1 CPU each unless told) run on what the "
                     "training workers leave: lower resources_per_worker (e.g. {'CPU': 0.5}), pass "
                     "map_batches(..., num_cpus=0.5), use fewer workers, or add CPUs (a node; ray.init(num_cpus=...) "
                     "before building the dataset).")
    if any(d.gang for d in stuck):
        lines.append("  A worker group waits for its workers' resources: close() the Trainers that hold other "
                     "groups, stop other Ray work, lower num_workers or resources_per_worker, or add a node.")
    lines.append("  (These are the cluster's demands: on a shared or autoscaling cluster some may be others'.)")
    return "\n".join(lines)


def tell(text: str):
    print(text, file=sys.stderr, flush=True)


class PendingWatch:
    """The pump's companion: `progress()` at every message of the job, `look()` at every turn of its loop."""

    def __init__(self, read: Callable[[], Optional[ClusterView]] = read_cluster, report: Callable[[str], None] = tell,
                 quiet_s: float = QUIET_S, every_s: float = LOOK_EVERY_S, looks: int = LOOKS,
                 clock: Callable[[], float] = time.monotonic):
        self.read, self.report, self.clock = read, report, clock
        self.quiet_s, self.every_s, self.looks = quiet_s, every_s, looks
        self._since = self._looked = clock()
        self._last: Optional[tuple] = None  # what the last look saw stuck, and what was free
        self._streak = 0  # how many looks in a row saw it unchanged
        self.told = False

    def progress(self):
        self._since, self._last, self._streak, self.told = self.clock(), None, 0, False

    def look(self, now: Optional[float] = None):
        now = self.clock() if now is None else now
        if self.told or now - self._since < self.quiet_s or now - self._looked < self.every_s:
            return
        self._looked = now
        view = self.read()
        stuck = view.unplaceable() if view is not None else []
        # Unchanged over `looks` looks: a pipeline that runs changes its queue and what is free as its tasks end; a
        # demand that Ray will never place (without a new node) keeps both.
        seen = (tuple(stuck), tuple(sorted(view.most_free().items()))) if stuck else None
        self._streak = self._streak + 1 if seen is not None and seen == self._last else int(seen is not None)
        self._last = seen
        if self._streak >= self.looks:
            self.told = True
            self.report(describe(stuck, view, now - self._since))

    def on_stall(self):
        """A rank's watchdog reported a stall: say at once what Ray cannot place, if anything (its likely cause)."""
        view = self.read()
        stuck = view.unplaceable() if view is not None else []
        if stuck:
            self.told = True
            self.report(describe(stuck, view, self.clock() - self._since))
