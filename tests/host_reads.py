"""Counting the host's reads of device values, on a machine without a GPU.

On a GPU, reading a device tensor's value on the host (`.item()`, `float(t)`, `if t:`, `.tolist()`, `.cpu()`,
a blocking `.to("cpu")`, a boolean-mask index, ...) makes the host wait for all the work queued on the device: it
stops queueing the next kernels. `HostReads`, a `TorchFunctionMode`, sees these calls on CPU too. What it cannot
see on CPU is where a tensor lives, so it keeps track of that itself, with `DEVICE` (`cpu:0`: a device torch
accepts and computes on as the CPU, but which `.to()` and `device=` arguments tell apart from "cpu") standing for
the accelerator. Give the loop under test `DEVICE` as its device.

- Host tensors: those passed to `host()` (a dataset's rows), and, while counting, what a factory makes without
  `device=` or with `device="cpu"` (a collator's batch), copies to the host (`.cpu()`, `.to("cpu")`), and
  whatever is computed from host tensors only.
- Device tensors: everything else, which includes every tensor made before counting began and not passed to
  `host()` (parameters, gradients, optimizer state), a host tensor moved `.to(DEVICE)` (returned as a new
  tensor, as a real move makes one), and what a factory makes with `device=DEVICE`. While counting, a device
  tensor's `.device` is `DEVICE` (so `x.to(t.device)` moves to the device, as on a GPU).

A read of a device tensor is counted, with where it was made from; a read of a host tensor is not (it waits for
nothing on a GPU), nor is a non-blocking copy to the host (whoever reads it later waits on an event, which this
counter does not see). The rules err towards counting: a host scalar made before counting (torch's Adam keeps its
step counts on the host) counts as a device read, in any loop that uses it alike, so compare a loop's count with
a reference loop's (the same model and optimizer by hand), not with zero.

Usual use: `with HostReads() as reads: ...`, then `reads.count` and `reads.sites()` (a Counter of
"file:line what", for the failure message). The mode also follows the backward pass into autograd hooks (DDP's
and FSDP's Python hooks) and a tensor subclass's `__torch_function__`, which a plain TorchFunctionMode would not.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from typing import Any, List, Tuple

import torch
from torch.autograd.graph import _engine_run_backward
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten
from torch.utils.weak import WeakIdKeyDictionary

DEVICE = torch.device("cpu", 0)
Tensor = torch.Tensor

# Calls that hand a tensor's value to Python: on a GPU each waits for the device.
READS = frozenset({
    Tensor.item, Tensor.tolist, Tensor.__bool__, Tensor.__float__, Tensor.__int__, Tensor.__index__,
    Tensor.__complex__, Tensor.numpy, Tensor.__array__, Tensor.__format__, Tensor.__repr__, Tensor.__contains__,
    Tensor.__reduce_ex__, Tensor.is_nonzero, torch.is_nonzero, Tensor.equal, torch.equal, Tensor.allclose,
    torch.allclose,
})
# Results whose shape depends on the values: the host needs the device's count before it can go on.
VALUE_SHAPED = frozenset({
    Tensor.nonzero, torch.nonzero, Tensor.argwhere, torch.argwhere, Tensor.masked_select, torch.masked_select,
    Tensor.unique, torch.unique, torch.unique_consecutive, torch.bincount, Tensor.bincount,
})
_DEVICE_ATTRIBUTE = Tensor.device  # the getter of `t.device`
_HERE = os.path.abspath(__file__)
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))

# Host tensors, shared by every counter (host() may mark a dataset before counting starts).
_host = WeakIdKeyDictionary()


def host(tree: Any) -> Any:
    """Mark the tensors in `tree` (a tensor, or lists/dicts of them) as host memory; returns `tree`."""
    for leaf in tree_flatten(tree)[0]:
        if isinstance(leaf, Tensor):
            _host[leaf] = True
    return tree


def on_host(tensor: Tensor) -> bool:
    return tensor in _host


class HostReads(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.reads: List[Tuple[str, str]] = []  # (what, where), in order
        self._in_subclass = False
        self.active = False  # started and not stopped (start/stop)

    @property
    def count(self) -> int:
        return len(self.reads)

    def sites(self) -> Counter:
        return Counter(f"{where} {what}" for what, where in self.reads)

    def start(self) -> "HostReads":
        """Count from here on (for callbacks that start and stop at different points of a loop)."""
        self.active = True
        return self.__enter__()

    def stop(self) -> None:
        """Stop counting (a no-op when stopped): call it in the thread that started, also when the loop raised,
        or the mode stays on in that thread."""
        if self.active:
            self.active = False
            self.__exit__(None, None, None)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(func, "__self__", None) is _DEVICE_ATTRIBUTE:  # `t.device`: where this counter says it is,
            return func(*args, **kwargs) if on_host(args[0]) else DEVICE  # so `x.to(t.device)` is no read
        if func is Tensor.backward:  # run the engine with this mode on, so hooks' reads are seen
            with self:
                return _backward(*args, **kwargs)
        subclass = next((t for t in types if _overrides(t)), None)
        if subclass is not None and not self._in_subclass:  # its __torch_function__ (a late value's
            self._in_subclass = True  # resolution) runs with this mode on; once, whatever it calls back
            try:
                with self:
                    return subclass.__torch_function__(func, types, args, kwargs)
            finally:
                self._in_subclass = False
        inputs = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, Tensor)]
        if func in READS or func in VALUE_SHAPED:
            if inputs and not on_host(inputs[0]):
                self._count(func)
            return func(*args, **kwargs)
        if func is Tensor.__getitem__ and _mask_index(args[1:]) and not on_host(args[0]):
            self._count(func)
        if func in (Tensor.to, Tensor.cpu):
            return self._move(func, args, kwargs)
        if func is Tensor.copy_ and on_host(args[0]) and not on_host(args[1]) and not _non_blocking(args, kwargs):
            self._count(func)
        out = func(*args, **kwargs)
        device = kwargs.get("device")
        made_on_host = (device is None and all(on_host(x) for x in inputs)) or (
            device is not None and torch.device(device) == torch.device("cpu"))
        if made_on_host:
            ids = {id(x) for x in inputs}
            host([x for x in tree_flatten(out)[0] if isinstance(x, Tensor) and id(x) not in ids])
        return out

    def _move(self, func, args, kwargs):
        source = args[0]
        if func is Tensor.cpu:
            target, blocking = torch.device("cpu"), True
        else:
            target, _, non_blocking, _ = torch._C._nn._parse_to(*args[1:], **kwargs)
            blocking = not non_blocking
        out = func(*args, **kwargs)
        if target is None:  # a dtype change: stays where it is
            if on_host(source) and out is not source:
                host(out)
            return out
        if target == torch.device("cpu"):  # to the host
            if on_host(source):
                return out
            if blocking:
                self._count(func)
            return host(out.clone() if out is source else out)
        if on_host(source):  # to the device: a new tensor, as a real move makes
            return out.clone() if out is source else out
        return out

    def _count(self, func) -> None:
        self.reads.append((getattr(func, "__name__", str(func)), _caller()))


def _overrides(cls) -> bool:
    """A tensor subclass with its own `__torch_function__` (Parameter and DTensor keep torch's)."""
    own = getattr(cls.__torch_function__, "__func__", cls.__torch_function__)
    return own not in (_TENSOR_FUNCTION, torch._C._disabled_torch_function_impl)


_TENSOR_FUNCTION = Tensor.__torch_function__.__func__


def _backward(tensor, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """`Tensor.backward` without going back through torch-function dispatch (which would run the autograd hooks
    with this mode off)."""
    gradient = torch.ones_like(tensor) if gradient is None else gradient
    inputs = (inputs,) if isinstance(inputs, Tensor) else tuple(inputs or ())
    _engine_run_backward((tensor,), (gradient,), create_graph if retain_graph is None else retain_graph,
                         create_graph, inputs, allow_unreachable=True, accumulate_grad=True)


def _mask_index(index) -> bool:
    """A boolean tensor among the index: the result's length is the device's count of True."""
    return any(isinstance(x, Tensor) and x.dtype == torch.bool for x in tree_flatten(index)[0])


def _non_blocking(args, kwargs) -> bool:
    return bool(kwargs.get("non_blocking", args[2] if len(args) > 2 else False))


def _caller() -> str:
    """The innermost frame outside torch and this file: the code that asked for the value."""
    frame = sys._getframe(2)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path != _HERE and not path.startswith(_TORCH):
            return f"{os.path.relpath(path)}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"
