"""Which of Ray Train's default callbacks a worker group starts with (coordinator/group.py): never the
DatasetsCallback's DatasetManager actor, and Ray Train's placement-group cleaner only where the Trainer runs
inside a Ray actor or task (a Tune trial), whose process Ray can kill while its Ray job goes on; a driver
process removes an orphaned placement group itself (tests/integration/test_worker_group.py kills a
controller to show it)."""

import pytest
from ray.train import ScalingConfig

from raytrainer.coordinator.group import _group_trainer_class, driver_is_a_ray_worker


def default_callbacks(keeps_cleaner: bool) -> list:
    trainer = _group_trainer_class(keeps_cleaner)(lambda: None, scaling_config=ScalingConfig(num_workers=1))
    return [type(callback).__name__ for callback in trainer._create_default_callbacks()]


def test_the_cleaner_only_where_kept_and_never_the_datasets_callback():
    kept, left_out = default_callbacks(True), default_callbacks(False)
    assert "PlacementGroupCleanerCallback" in kept and "PlacementGroupCleanerCallback" not in left_out
    assert "DatasetsCallback" not in kept + left_out
    # Everything else Ray Train sets up stays: devices, the process group, the working directory.
    assert [c for c in kept if c != "PlacementGroupCleanerCallback"] == left_out
    assert {"AcceleratorSetupCallback", "BackendSetupCallback"} <= set(left_out)


@pytest.mark.usefixtures("ray_session")
def test_a_trainer_in_a_ray_task_or_actor_keeps_the_cleaner_and_a_driver_does_not():
    import ray

    @ray.remote(num_cpus=0)
    def in_a_task():
        return driver_is_a_ray_worker()

    @ray.remote(num_cpus=0)
    class InAnActor:
        def ask(self):
            return driver_is_a_ray_worker()

    actor = InAnActor.remote()
    try:
        assert driver_is_a_ray_worker() is False
        assert ray.get(in_a_task.remote()) is True and ray.get(actor.ask.remote()) is True
    finally:
        ray.kill(actor)
