"""What a hosted job may change in a worker process that outlives it, put back when it ends.

A kept worker group runs job after job in the same processes (coordinator/group.py). A script, or a trainer
built by the user's code, changes process-wide state as it would in a process of its own: environment
variables, sys.argv and sys.path, the working directory, accelerate's singletons (`PartialState`,
`AcceleratorState`, `GradientState`: the next Trainer would find the last one's), torch's default dtype and
the attributes of transformers' modules (a kernel library swapping a model's classes, a script patching a
function). Each is snapshotted before the job and restored after it; a transformers module first imported
during the job is snapshotted as its import ends, so a patch applied to it later is undone too.

The process group is Ray Train's: it outlives the job. transformers 5's `Trainer.end()` (and many torchrun
scripts) destroy it at the end, and a script may initialise its own: while a job runs, destroying the world
group is a no-op and initialising an already initialised one returns at once.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import logging
import os
import sys
from typing import Dict, Iterator

import torch
import torch.distributed as dist

from ...verbosity import verbose

logger = logging.getLogger("raytrainer")

PATCHED_PACKAGES = ("transformers.",)  # whose modules' attributes are put back after a job


@contextlib.contextmanager
def sandbox() -> Iterator[None]:
    environ, argv, path, cwd = dict(os.environ), list(sys.argv), list(sys.path), os.getcwd()
    main, dtype = sys.modules.get("__main__"), torch.get_default_dtype()
    modules = _ModuleSnapshots()
    restore_dist = _guard_process_group()
    restore_bars = _quiet_dataset_bars()
    try:
        yield
    finally:
        restore_bars()
        restore_dist()
        modules.restore()
        os.environ.clear()
        os.environ.update(environ)
        sys.argv[:] = argv
        sys.path[:] = path
        if main is not None:
            sys.modules["__main__"] = main
        with contextlib.suppress(OSError):
            os.chdir(cwd)
        torch.set_default_dtype(dtype)
        reset_accelerate()


def reset_accelerate():
    """Forget accelerate's process-wide state: the next Trainer builds its own from the environment."""
    try:
        from accelerate.state import AcceleratorState, GradientState
    except ImportError:  # pragma: no cover (transformers' Trainer requires accelerate)
        return
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()


def _quiet_dataset_bars():
    """datasets' progress bars (a TRL trainer maps its dataset several times) stay off on the workers: every
    rank's bar would reach the driver's console. Returns what turns them back to how they were."""
    try:
        from datasets.utils import logging as datasets_logging
    except ImportError:
        return lambda: None
    if verbose() or not datasets_logging.is_progress_bar_enabled():
        return lambda: None
    datasets_logging.disable_progress_bar()
    return datasets_logging.enable_progress_bar


def _guard_process_group():
    """Keep Ray Train's process group up while the job runs; returns the function that lifts the guard."""
    destroy, init = dist.destroy_process_group, dist.init_process_group

    def destroy_process_group(group=None):
        if group is None or group is dist.GroupMember.WORLD:
            logger.debug("destroy_process_group() ignored: the process group is Ray Train's and outlives the job")
            return
        destroy(group)

    def init_process_group(*args, **kwargs):
        if dist.is_initialized():
            logger.debug("init_process_group() ignored: Ray Train's process group is already up")
            return
        return init(*args, **kwargs)

    dist.destroy_process_group, dist.init_process_group = destroy_process_group, init_process_group
    return lambda: (setattr(dist, "destroy_process_group", destroy), setattr(dist, "init_process_group", init))


class _ModuleSnapshots(importlib.abc.MetaPathFinder):
    """The attribute dicts of transformers' modules: those loaded now, and those the job imports (taken when
    their import ends, through this finder's wrapping of their loader)."""

    def __init__(self):
        self.saved: Dict[str, dict] = {name: dict(module.__dict__) for name, module in list(sys.modules.items())
                                       if name.startswith(PATCHED_PACKAGES) and module is not None}
        sys.meta_path.insert(0, self)

    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith(PATCHED_PACKAGES) or fullname in self.saved:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _SnapshotLoader(spec.loader, self.saved)
                return spec
        return None

    def restore(self):
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        for name, attributes in self.saved.items():
            module = sys.modules.get(name)
            if module is None:
                continue
            current = module.__dict__  # attributes added since (lazy imports fill them in) are kept
            for key, value in attributes.items():
                if current.get(key, _MISSING) is not value:
                    current[key] = value


_MISSING = object()


class _SnapshotLoader(importlib.abc.Loader):
    def __init__(self, loader, saved: Dict[str, dict]):
        self.loader, self.saved = loader, saved

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        self.saved[module.__name__] = dict(module.__dict__)

    def __getattr__(self, name):
        return getattr(self.loader, name)
