"""The process group of a worker group, set up as Ray Train's TorchConfig does, from a module without torch.

Ray Train's controller actor (one per group start) unpickles the trainer's backend configuration, and
TorchConfig's module imports torch at its top: 1.7 CPU seconds in the controller, beside the workers that
import it at the same time on the same cores, for an actor that never runs a tensor. This backend does what
TorchConfig's does for the backends raytrainer uses (gloo, nccl) with the same functions, called on the
workers by name (`_in_torch_config`), where torch is imported anyway. TPUs are not among them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Dict

import ray
from ray.train._internal.utils import get_address_and_port
from ray.train.backend import Backend, BackendConfig
from ray.train.v2._internal.util import TrainingFramework

logger = logging.getLogger(__name__)


@dataclass
class GroupTorchConfig(BackendConfig):
    """TorchConfig(backend=..., init_method="env", timeout_s=...), unpickled without torch."""
    backend: str = "gloo"
    timeout_s: int = 1800

    @property
    def backend_cls(self):
        return GroupTorchBackend

    @property
    def train_func_context(self):
        return _train_func_context  # on the workers: the default CUDA device, as TorchConfig's sets it

    @property
    def framework(self):
        return TrainingFramework.TORCH

    def to_dict(self) -> Dict[str, Any]:
        return {"backend": self.backend, "init_method": "env", "timeout_s": self.timeout_s}


def _train_func_context():
    """TorchConfig's context manager around the train function, imported where it runs (a worker)."""
    from ray.train.torch.config import TorchConfigContextManager

    return TorchConfigContextManager()


def _in_torch_config(name: str, *args, **kwargs):
    """On a worker: Ray Train's own function `name` of ray.train.torch.config."""
    from ray.train.torch import config

    return getattr(config, name)(*args, **kwargs)


def _set_master(addr: str, port: int):
    os.environ["MASTER_ADDR"] = addr
    os.environ["MASTER_PORT"] = str(port)


class GroupTorchBackend(Backend):
    share_cuda_visible_devices: bool = True  # as TorchConfig's: every GPU of the node visible, for NCCL

    def on_start(self, worker_group, backend_config: GroupTorchConfig):
        addr, port = worker_group.execute_single(0, get_address_and_port)
        worker_group.execute(_set_master, addr=addr, port=port)
        # LOCAL_RANK, RANK, WORLD_SIZE, ... (torchrun's variables) before init_process_group
        worker_group.execute(_in_torch_config, "_set_torch_distributed_env_vars")
        ray.get([worker_group.execute_single_async(
            rank, _in_torch_config, "_setup_torch_process_group", backend=backend_config.backend, world_rank=rank,
            world_size=len(worker_group), init_method="env://", timeout_s=backend_config.timeout_s)
            for rank in range(len(worker_group))])

    def on_shutdown(self, worker_group, backend_config: GroupTorchConfig):
        from ray._private import ray_constants
        from ray.exceptions import GetTimeoutError
        from ray.train.constants import (
            DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
            TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
        )

        futures = worker_group.execute_async(_in_torch_config, "_shutdown_torch",
                                             destroy_process_group=len(worker_group) > 1)
        timeout_s = ray_constants.env_integer(TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S,
                                              DEFAULT_TORCH_PROCESS_GROUP_SHUTDOWN_TIMEOUT_S)
        try:
            ray.get(futures, timeout=timeout_s)
        except GetTimeoutError:
            logger.warning(f"Torch process group shutdown timed out after {timeout_s} seconds")
