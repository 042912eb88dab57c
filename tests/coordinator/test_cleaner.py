"""The placement-group cleaner a Trainer inside a Ray actor (a Tune trial) keeps: it asks the GCS of its own
Ray whether the controller lives. Ray Train's asked the dashboard's state API, found as Ray's CLI finds it:
in a Ray without a dashboard it never removed anything, and pointed at another Ray it took a live controller
for dead. Here its processes are pointed at an address where nothing answers."""

import time

import pytest

from tests.support import wait_for

NOTHING_ANSWERS = {"RAY_API_SERVER_ADDRESS": "http://127.0.0.1:9", "RAY_ADDRESS": "http://127.0.0.1:9"}


class Idle:
    def ready(self):
        return True


def live_actor(ray):
    """An actor that stands for a run's controller: alive until killed."""
    actor = ray.remote(num_cpus=0)(Idle).remote()
    ray.get(actor.ready.remote())
    return actor


def test_the_cleaner_keeps_a_live_controllers_placement_group_and_removes_a_dead_ones(ray_session):
    ray = ray_session
    from ray.util.placement_group import placement_group, placement_group_table

    from raytrainer.coordinator.cleaner import GcsPlacementGroupCleaner

    controller = live_actor(ray)
    group = placement_group([{"CPU": 0.01}])
    ray.get(group.ready(), timeout=60)
    cleaner = ray.remote(num_cpus=0)(GcsPlacementGroupCleaner).options(
        runtime_env={"env_vars": NOTHING_ANSWERS}).remote(
        controller_actor_id=controller._actor_id.hex(), check_interval_s=0.2, get_actor_timeout_s=1,
        stop_timeout=2)
    ray.get(cleaner.register_placement_group.remote(group))
    ray.get(cleaner.start_monitoring.remote())

    state = lambda: placement_group_table(group)["state"]  # noqa: E731
    time.sleep(2)  # ten checks of a live controller
    assert state() == "CREATED"
    ray.kill(controller)
    assert wait_for(lambda: state() == "REMOVED", 30, every_s=0.2)
    with pytest.raises(ray.exceptions.RayActorError):  # its work done, the cleaner ends itself
        ray.get(cleaner.start_monitoring.remote(), timeout=30)


def test_an_unknown_actor_is_not_alive_and_a_live_one_is(ray_session):
    from raytrainer.coordinator.cleaner import controller_alive

    alive = live_actor(ray_session)
    assert controller_alive(alive._actor_id.hex())
    assert not controller_alive("f" * 32)
