"""How large objects travel between the driver and the workers: once, through Ray's object store.

Out: the trainer (with the user's subclass) and its work order are pickled with cloudpickle (`pack_job`;
the attributes in DRIVER_ONLY stay on the driver), but the data of every
tensor that belongs to a module (parameters and buffers of the model, of a subclass's `ref_model`, ...),
of every other large tensor (a torch dataset's rows) and every protocol-5 out-of-band buffer (numpy arrays,
an in-memory `datasets.Dataset`'s Arrow columns) is left out of the pickle and collected as numpy arrays.
The driver puts those arrays into the object store once (`ray.put`); on one node a worker's `ray.get`
maps them from shared memory without a copy. The pickle itself stays a few KB whatever the model's size.
A `ray.data.Dataset` is left out too and goes beside the arrays, so that Ray's own serializer carries it:
the references to a materialized dataset's blocks stay counted (in a plain pickle they would be pinned for
the driver's life).

In: a module tensor is copied out of the shared memory into the worker's own tensor (the worker trains
it); other tensors and buffers stay zero-copy views, read-only in spirit (a dataset is read, not written).
Identity survives: a Parameter reached twice (tied weights, an optimizer passed by the user) is one
Parameter again on the worker.

Back: rank 0 puts its trained state dict (numpy views of its CPU tensors, tied tensors once) into the
object store; the driver maps it and `load_state_dict` copies it into its model. The object belongs to the
worker that put it (Ray 2.56 removed `ray.put(_owner=...)`) and is lost when that worker exits, so rank 0
waits until the driver has read it (`worker/entry.py`, `coordinator/pump.py`). A memory-mapped
`datasets.Dataset` pickles as its cache files' paths, so it travels as paths (readable on every worker of one
node, or on a shared file system).
"""

from __future__ import annotations

import io
import pickle
import sys
import warnings
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import cloudpickle
import numpy as np
import torch
from torch import nn

from .errors import ConfigError
from .protocol import SharedState  # defined beside the results that carry it: the event sink reads it without torch

# Tensors and buffers below this size stay inside the pickle: one object-store entry each would cost
# more than the bytes. Module tensors go out whatever their size, so the pickle never grows with the model.
INLINE_BYTES = 64 * 1024

# numpy has no bfloat16 / float8: such tensors travel as same-width integers and are viewed back.
_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass
class Packed:
    """A pickled object without its large data (`payload`), and that data as numpy arrays."""
    payload: bytes
    tensors: List[np.ndarray] = field(default_factory=list)
    buffers: List[np.ndarray] = field(default_factory=list)
    ray_datasets: list = field(default_factory=list)

    @property
    def data(self) -> Dict[str, list]:
        """What goes into the object store, as one object."""
        return {"tensors": self.tensors, "buffers": self.buffers, "ray_datasets": self.ray_datasets}

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.tensors) + sum(a.nbytes for a in self.buffers)


def is_ray_dataset(obj: Any) -> bool:
    # A ray.data.Dataset exists only once ray.data is imported: asking imports nothing (ray.data is slow to import).
    data = sys.modules.get("ray.data")
    return data is not None and isinstance(obj, data.Dataset)


# ------------------------------------------------------------------------------------------ tensor <-> numpy
def _to_numpy(tensor: torch.Tensor) -> Tuple[np.ndarray, str]:
    """A numpy view of the tensor's data (a copy only if it is not on the CPU or not contiguous)."""
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    dtype = str(t.dtype).removeprefix("torch.")
    try:
        return t.numpy(), dtype
    except TypeError:  # bfloat16, float8: no numpy dtype of that name
        return t.view(_INT_OF_WIDTH[t.element_size()]).numpy(), dtype


def _from_numpy(array: np.ndarray, dtype: str) -> torch.Tensor:
    """A tensor over the array's memory (no copy). Arrays from the object store are read-only."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        tensor = torch.from_numpy(array)
    wanted = getattr(torch, dtype)
    return tensor if tensor.dtype == wanted else tensor.view(wanted)


def _transferable(obj: Any) -> bool:
    return (type(obj) in (torch.Tensor, nn.Parameter) and obj.layout == torch.strided
            and obj.device.type != "meta" and not obj.is_quantized)


# --------------------------------------------------------------------------------------------------- out
class _Pickler(cloudpickle.Pickler):
    def __init__(self, file, packed: Packed, module_tensors: set):
        super().__init__(file, protocol=5, buffer_callback=self._out_of_band)
        self._packed = packed
        self._module_tensors = module_tensors
        self._pids: Dict[int, tuple] = {}
        self._alive: list = []  # keeps every tensor seen alive, so id() stays unique while pickling

    def persistent_id(self, obj):
        if isinstance(obj, nn.Module):  # seen before its tensors: mark them as the module's
            self._module_tensors.update(_module_tensor_ids(obj, recurse=False))
            return None
        if is_ray_dataset(obj):
            self._packed.ray_datasets.append(obj)
            return ("ray_dataset", len(self._packed.ray_datasets) - 1, None, False)
        if not _transferable(obj):
            return None
        pid = self._pids.get(id(obj))
        if pid is not None:
            return pid
        owned = type(obj) is nn.Parameter or id(obj) in self._module_tensors
        if not owned and obj.numel() * obj.element_size() < INLINE_BYTES:
            return None
        array, dtype = _to_numpy(obj)
        self._packed.tensors.append(array)
        kind = "param" if type(obj) is nn.Parameter else ("module" if owned else "data")
        pid = (kind, len(self._packed.tensors) - 1, dtype, bool(obj.requires_grad))
        self._pids[id(obj)] = pid
        self._alive.append(obj)
        return pid

    def _out_of_band(self, buffer: pickle.PickleBuffer) -> bool:
        view = buffer.raw()
        if view.nbytes < INLINE_BYTES:
            return True  # a true value keeps the buffer in the pickle
        self._packed.buffers.append(np.frombuffer(view, dtype=np.uint8))
        return False


def _module_tensor_ids(module: nn.Module, recurse: bool = True) -> set:
    tensors = [*module.parameters(recurse=recurse), *module.buffers(recurse=recurse)]
    return {id(t) for t in tensors}


def pack(obj: Any) -> Packed:
    """Pickle `obj` (cloudpickle: classes defined in scripts and notebooks travel by value) without the data
    of its module tensors, large tensors and out-of-band buffers, which come back as numpy arrays."""
    packed = Packed(b"")
    # Every module's tensors, wherever the pickler meets them first (an optimizer may hold them before the
    # model is reached): they are copied on the worker, which trains them; data tensors are not.
    module_tensors = set()
    for value in _values(obj):
        if isinstance(value, nn.Module):
            module_tensors |= _module_tensor_ids(value)
    out = io.BytesIO()
    _Pickler(out, packed, module_tensors).dump(obj)
    packed.payload = out.getvalue()
    return packed


# Trainer attributes that stay on the driver: its callbacks run there, on the event stream (the callbacks that
# run on every rank travel in the work order), and the worker group its calls use (coordinator/holders.py).
DRIVER_ONLY = ("callback_handler", "_pool_user")


def pack_job(trainer, order: Any) -> Packed:
    """The trainer and its work order (`protocol.TrainOrder`, ...) as the workers receive them: `pack((trainer,
    order))`. A failure names what cannot be pickled: the order's dataset, else the trainer's attribute, and
    suggests model_init for the model."""
    try:
        return pack((trainer, order))
    except Exception as exc:
        dataset = getattr(order, "dataset", None)
        if dataset is not None and _unpicklable_attribute({"dataset": dataset}) is not None:
            raise ConfigError(f"The dataset cannot be sent to the workers: it cannot be serialised "
                              f"({type(exc).__name__}: {exc}). Pass a datasets.Dataset or a picklable "
                              "torch Dataset.") from exc
        culprit = _unpicklable_attribute(trainer.__getstate__())
        hint = ("Pass model_init=<a function that builds the model> instead of the model object, so each "
                "worker builds its own." if culprit in (None, "model") else
                f"Make Trainer.{culprit} serialisable, or create it inside a hook that runs on the workers.")
        raise ConfigError(f"The trainer cannot be sent to the workers: {culprit or 'an attribute'} cannot be "
                          f"serialised ({type(exc).__name__}: {exc}). {hint}") from exc


def _unpicklable_attribute(state: Dict[str, Any]) -> Optional[str]:
    """The first name whose value cloudpickle refuses."""
    for name, value in state.items():
        try:
            cloudpickle.dumps(value)
        except Exception:
            return name
    return None


def _values(obj: Any, depth: int = 3):
    """Objects reachable through attributes, dicts, lists and tuples, a few levels deep."""
    if depth < 0:
        return
    yield obj
    if isinstance(obj, dict):
        children = obj.values()
    elif isinstance(obj, (list, tuple)):
        children = obj
    elif hasattr(obj, "__dict__") and not isinstance(obj, (nn.Module, type)):
        children = vars(obj).values()
    else:
        return
    for child in children:
        yield from _values(child, depth - 1)


# ---------------------------------------------------------------------------------------------------- in
class _Unpickler(pickle.Unpickler):
    def __init__(self, file, tensors: List[np.ndarray], buffers: List[np.ndarray], ray_datasets: list):
        super().__init__(file, buffers=iter(buffers))
        self._tensors = tensors
        self._ray_datasets = ray_datasets
        self._made: Dict[int, torch.Tensor] = {}

    def persistent_load(self, pid):
        kind, index, dtype, requires_grad = pid
        if kind == "ray_dataset":
            return self._ray_datasets[index]
        tensor = self._made.get(index)
        if tensor is None:
            tensor = _from_numpy(self._tensors[index], dtype)
            if kind != "data":  # the worker trains it: its own writable memory
                tensor = tensor.clone()
            if kind == "param":
                tensor = nn.Parameter(tensor, requires_grad=requires_grad)
            self._made[index] = tensor
        return tensor


def unpack(payload: bytes, data: Dict[str, list]) -> Any:
    return _Unpickler(io.BytesIO(payload), data["tensors"], data["buffers"], data["ray_datasets"]).load()


# ------------------------------------------------------------------------------------------ trained weights
def put_state(state: Dict[str, Any]) -> SharedState:
    """Put a state dict into the object store once (tied tensors once). The caller owns the object: it must
    live until the reader has fetched it."""
    import ray

    arrays: List[np.ndarray] = []
    entries: Dict[str, Any] = {}
    seen: Dict[tuple, int] = {}
    for name, value in state.items():
        if not _transferable(value):
            entries[name] = ("value", value)  # a module's `_extra_state`, say: pickled as it is
            continue
        key = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape),
               tuple(value.stride()), value.dtype, value.device)
        if key not in seen:
            array, _ = _to_numpy(value)
            arrays.append(array)
            seen[key] = len(arrays) - 1
        entries[name] = ("array", seen[key], str(value.dtype).removeprefix("torch."))
    ref = ray.put({"arrays": arrays, "entries": entries})
    return SharedState(ref, sum(a.nbytes for a in arrays))


def fetch_state(shared: SharedState) -> Dict[str, Any]:
    """The state dict as tensors over the object store's memory (no copy on the same node; read-only:
    load them into a model, which copies)."""
    import ray

    stored = ray.get(shared.ref)
    arrays = stored["arrays"]
    state: Dict[str, Any] = {}
    for name, entry in stored["entries"].items():
        state[name] = entry[1] if entry[0] == "value" else _from_numpy(arrays[entry[1]], entry[2])
    return state

