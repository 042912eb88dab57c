"""Which of Ray Train's default callbacks a worker group starts with (coordinator/group.py): never the
DatasetsCallback's DatasetManager actor, and a placement-group cleaner (ours: tests/coordinator/test_cleaner.py)
only where the Trainer runs inside a Ray actor or task (a Tune trial), whose process Ray can kill while its Ray
job goes on; a driver process removes an orphaned placement group itself (tests/integration/test_worker_group.py
kills a controller to show it)."""

import subprocess
import sys

import pytest
from ray import cloudpickle
from ray.train import ScalingConfig

from raytrainer.coordinator.group import _group_trainer_class, driver_is_a_ray_worker
from raytrainer.coordinator.torch_backend import GroupTorchBackend, GroupTorchConfig


def _ray_trains_callbacks() -> list:
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    return DataParallelTrainer(lambda: None, scaling_config=ScalingConfig(num_workers=1))._create_default_callbacks()


def default_callbacks(keeps_cleaner: bool) -> list:
    trainer = _group_trainer_class(keeps_cleaner)(lambda: None, scaling_config=ScalingConfig(num_workers=1))
    return [type(callback).__name__ for callback in trainer._create_default_callbacks()]


def test_the_cleaner_only_where_kept_ours_in_ray_trains_place_and_never_the_datasets_callback():
    kept, left_out = default_callbacks(True), default_callbacks(False)
    rays = [type(c).__name__ for c in _ray_trains_callbacks()]
    # Where kept, ours (asking the GCS: coordinator/cleaner.py) stands where Ray Train puts its own.
    assert kept.index("GcsCleanerCallback") == rays.index("PlacementGroupCleanerCallback")
    assert "GcsCleanerCallback" not in left_out and "PlacementGroupCleanerCallback" not in kept + left_out
    assert "DatasetsCallback" not in kept + left_out
    # Everything else Ray Train sets up stays: devices, the process group, the working directory.
    assert [c for c in kept if c != "GcsCleanerCallback"] == left_out
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


def test_the_controller_unpickles_the_groups_process_group_setup_without_importing_torch(tmp_path):
    """What Ray Train's controller actor gets of the backend (coordinator/torch_backend.py): in a process that has
    imported only what the controller has, it unpickles and builds its backend without torch (TorchConfig's
    module imports it: 1.7 CPU s per group start). The workers' process groups it sets up are every
    distributed test's."""
    blob = tmp_path / "config.pkl"
    blob.write_bytes(cloudpickle.dumps(GroupTorchConfig(backend="gloo", timeout_s=60)))
    code = ("import pickle, sys; import ray.train.v2._internal.execution.controller; "
            "config = pickle.load(open(sys.argv[1], 'rb')); backend = config.backend_cls(); "
            "print(type(backend).__name__, config.to_dict(), config.framework.value, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code, str(blob)], capture_output=True, text=True, check=True).stdout
    last = out.split("\n")[-2]
    assert last == "GroupTorchBackend {'backend': 'gloo', 'init_method': 'env', 'timeout_s': 60} torch False", out
    assert GroupTorchBackend.share_cuda_visible_devices  # as TorchConfig's backend: NCCL sees the node's GPUs
