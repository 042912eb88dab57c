"""The one collective of an optimizer step: every value the ranks must agree on travels in a single
all-reduce (SUM) of a few int64s, started when the step's micro-batches are taken and waited for only where a
value is used, so the training step does not stop for it.

Each component registers its slot once, in the same order on every rank, stages its local value before the
exchange and reads the sum after it:

    stop / preempt flags   worker/stopping.py       one bit per rank (preempting ranks, interrupting ranks):
                                                    distinct bits sum to their OR, so every rank learns who asked
    has-data counts        data/ray_batches.py      Ray Data of unknown length only: how many ranks have at
                                                    least k micro-batches for the step, k = 1..accumulation
    label items            worker/loop.py           num_items_in_batch of the global batch (and whether any
                                                    rank's labels cannot be counted)
    input tokens           worker/loop.py           include_num_input_tokens_seen

The loop starts the exchange once per optimizer step (`start()`), after taking the step's micro-batches and
before on_step_begin (worker/loop.py). What waits for it:
    - the label items: `late()` hands num_items_in_batch out as a 0-d tensor that completes the exchange at
      its first use, after the forward for most models (the loss divides by it), so the exchange's latency and
      the ranks' skew hide behind the forward instead of adding a second sync point to the step;
    - the has-data counts (Ray Data of unknown length): at once, before the step runs;
    - the input tokens: at the step's end, when the state counts them;
    - the stop flags: at the next step's start, before its micro-batches are taken (worker/stopping.py).
On a GPU (NCCL) the host never waits for the device's queued work (`DeviceTransport`): the values travel to the
device and back through pinned memory, the stream (not the host) waits for the collective, and reading the sums
on the host waits only for the device to reach their copy, which it does before the step's forward.
tests/worker/test_host_sync.py runs that branch on CPU and counts no read of a device value in it. (Not yet run
on several GPUs: on one there is no collective.) Without a process group the exchange is the identity and no
collective runs.
"""

from __future__ import annotations

from typing import Callable, List, Optional

import torch


class Slot:
    """`size` int64s of the exchange: `put` this rank's values before it, read `totals` (over ranks) after."""

    def __init__(self, sync: "StepSync", start: int, size: int):
        self.sync, self.start, self.size = sync, start, size

    def put(self, *values: int) -> None:
        """This rank's values for the next exchange (a slot left unset sends zeros)."""
        if len(values) > self.size:
            raise ValueError(f"{len(values)} values for a slot of {self.size}")
        self.sync._local[self.start:self.start + len(values)] = [int(v) for v in values]

    @property
    def totals(self) -> List[int]:
        """The sums over ranks of the last exchange (waiting for it if it is still in flight)."""
        return self.sync.read()[self.start:self.start + self.size]

    @property
    def total(self) -> int:
        return self.totals[0]


class StepSync:
    def __init__(self, ctx):
        self.ctx = ctx
        self.transport = transport_for(ctx.device)  # how the values reach the collective and come back
        self._local: List[int] = []
        self._buffer: Optional[torch.Tensor] = None  # the exchange's tensor, summed in place
        self._work = None  # the collective in flight, if any
        self._totals: Optional[List[int]] = []  # the sums on the host; None until read
        self.exchanges = 0  # how many have run: tests count one per optimizer step

    def slot(self, size: int = 1) -> Slot:
        """Register `size` int64s; every rank registers the same slots in the same order."""
        slot = Slot(self, len(self._local), size)
        self._local.extend([0] * size)
        self._totals.extend([0] * size)
        return slot

    def start(self) -> None:
        """Collective (every rank, same point of the loop): start summing the staged values over ranks, then
        reset them. The sums are there once `complete()` (or reading a slot) has run."""
        self.complete()  # one exchange in flight at a time
        if self.ctx.distributed and self._local:
            self._buffer = self.transport.send(self._local)
            self._work = self.ctx.start_all_reduce_sum(self._buffer)
            self.transport.started(self._buffer, self.complete)
            self._totals = None
        else:
            self._buffer, self._totals = None, list(self._local)
        self._local = [0] * len(self._local)
        self.exchanges += 1

    def exchange(self) -> None:
        """`start()` and wait for it: the sums at once."""
        self.start()
        self.complete()

    def complete(self) -> None:
        """Wait for the exchange in flight (on a GPU the device's stream waits for NCCL: no host sync)."""
        if self._work is not None:
            work, self._work = self._work, None
            work.wait()

    def read(self) -> List[int]:
        """The last exchange's sums on the host (waiting for it)."""
        if self._totals is None:
            self.complete()
            self._totals = self.transport.receive(self._buffer)
        return self._totals

    def late(self, slot: Slot, floor: int = 0) -> torch.Tensor:
        """The slot's first sum (at least `floor`) as a 0-d int64 tensor on the device that completes the
        exchange when it is first used, not before: num_items_in_batch, which the loss reads after the forward."""
        if self._buffer is None:  # no collective in flight: a plain value
            return torch.tensor(max(self.read()[slot.start], floor), dtype=torch.int64, device=self.ctx.device)
        value = self._buffer[slot.start]

        def resolve():
            self.complete()
            value.clamp_(min=floor)

        return LateTotal(value, resolve)


class HostTransport:
    """gloo: the values are summed in host memory and read there (a host wait by nature)."""

    def send(self, values: List[int]) -> torch.Tensor:
        """The tensor the collective sums in place."""
        return torch.tensor(values, dtype=torch.int64)

    def started(self, buffer: torch.Tensor, complete: Callable[[], None]) -> None:
        """Right after the collective started: nothing to queue."""

    def receive(self, buffer: torch.Tensor) -> List[int]:
        """The sums on the host, once the collective completed."""
        return buffer.tolist()


class DeviceTransport(HostTransport):
    """NCCL: the host never waits for the device's queued work. The values go to the device from pinned memory
    and come back into pinned memory without blocking; the stream (not the host) waits for the collective, and
    reading the sums waits for an event recorded right after their copy back, which the device reaches before
    the step's forward, not for the step's work. `tests/worker/test_host_sync.py` runs this class on CPU with the
    two CUDA calls (`_pinned`, `_event`) replaced."""

    def __init__(self, device: torch.device):
        self.device = device
        self._host, self._copied = None, None  # the sums' copy to the host, and its event

    def send(self, values: List[int]) -> torch.Tensor:
        return self._pinned(torch.tensor(values, dtype=torch.int64)).to(self.device, non_blocking=True)

    def started(self, buffer: torch.Tensor, complete: Callable[[], None]) -> None:
        complete()  # NCCL's wait makes the stream wait, not the host
        self._host = buffer.to("cpu", non_blocking=True)
        self._copied = self._event()
        self._copied.record()

    def receive(self, buffer: torch.Tensor) -> List[int]:
        self._copied.synchronize()
        return self._host.tolist()

    def _pinned(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.pin_memory()

    def _event(self):
        return torch.cuda.Event()


def transport_for(device: torch.device) -> HostTransport:
    return DeviceTransport(device) if device.type == "cuda" else HostTransport()


class LateTotal(torch.Tensor):
    """A 0-d tensor whose value arrives with a collective still in flight: any use of it (an operation, int(),
    .item(), a format) first runs `resolve` once, then works on a plain tensor, which is what it returns. So
    code written for transformers' num_items_in_batch (a tensor) needs no change, and cannot read it early."""

    @staticmethod
    def __new__(cls, value: torch.Tensor, resolve: Callable[[], None]):
        tensor = torch.Tensor._make_subclass(cls, value)
        tensor._resolve = resolve
        return tensor

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        def plain(value):
            if isinstance(value, LateTotal):
                if value._resolve is not None:
                    value._resolve()
                    value._resolve = None
                return value.as_subclass(torch.Tensor)
            return value

        args, kwargs = torch.utils._pytree.tree_map(plain, (args, kwargs or {}))
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)


def rank_bits(world_size: int) -> int:
    """int64 words for one bit per rank (62 bits a word: a sum of distinct bits never reaches the sign)."""
    return max(1, -(-world_size // BITS))


BITS = 62


def set_rank_bit(words: List[int], rank: int) -> None:
    words[rank // BITS] |= 1 << (rank % BITS)


def ranks_in(words: List[int]) -> List[int]:
    return [w * BITS + b for w, word in enumerate(words) for b in range(BITS) if word >> b & 1]
