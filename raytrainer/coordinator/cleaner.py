"""Ray Train's placement-group cleaner, asking the Ray it runs in whether the controller lives.

A worker group's placement group is made by Ray Train's controller, an actor, so it belongs to the Ray job
and outlives a controller that dies without removing it. Where the Trainer runs inside a Ray actor (a Tune
trial, which Tune kills with its controllers at a sweep's end) Ray Train's cleaner removes it: a detached
actor that asks each second whether the controller lives (`group.py` keeps it only there). Ray Train asks
the state API, which the dashboard serves and which the cleaner finds as Ray's CLI does
(`RAY_API_SERVER_ADDRESS`, `RAY_ADDRESS`, the cluster `ray start` last recorded on the machine): a Ray without
a dashboard had no API to ask (the cleaner warned each second and never removed anything: the next sweep's
trials waited for the CPUs), and where several Rays share a machine it asked another one, which answered "no
such actor" for a live controller and tore its group down. This cleaner asks the GCS of the Ray it is
connected to, the one whose actor table holds the controller, through the same call `ray.get_actor` uses.
"""

from __future__ import annotations

from ray.train.v2._internal.callbacks.placement_group_callback import PlacementGroupCleanerCallback
from ray.train.v2._internal.execution.controller.placement_group_cleaner import PlacementGroupCleaner


def controller_alive(actor_id: str, timeout: float = None) -> bool:
    """Whether the actor is not dead, from this Ray's GCS actor table (an actor gone from the table, as a
    long-dead one is, counts as dead). An unanswered GCS raises the error after which Ray Train's cleaner
    keeps watching instead of removing the placement group. `timeout`: Ray Train's signature, unused (the
    GCS client has its own)."""
    import ray._private.state
    from ray.util.state.exception import RayStateApiException

    try:
        found = ray._private.state.actors(actor_id=actor_id)
    except Exception as exc:  # noqa: BLE001 (any failure to ask is "unknown", never "dead")
        raise RayStateApiException(f"the GCS did not answer for actor {actor_id}: {exc}") from exc
    return bool(found) and found.get("State") != "DEAD"


class GcsPlacementGroupCleaner(PlacementGroupCleaner):
    def __init__(self, *args, **kwargs):
        from ray.train.v2._internal.execution.controller import placement_group_cleaner

        super().__init__(*args, **kwargs)
        # Ray Train's monitor loop calls its module's is_actor_alive; this process runs this one actor alone.
        placement_group_cleaner.is_actor_alive = controller_alive


class GcsCleanerCallback(PlacementGroupCleanerCallback):
    def after_controller_start(self, train_run_context):
        from ray.train.v2._internal.callbacks import placement_group_callback

        # Ray Train's callback starts the class its module names; this runs in the controller's own process.
        placement_group_callback.PlacementGroupCleaner = GcsPlacementGroupCleaner
        super().after_controller_start(train_run_context)
