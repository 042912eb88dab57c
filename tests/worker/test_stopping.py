"""The stop signals a worker stages before each step's exchange (raytrainer/worker/stopping.py): which ranks asked
and why (a preemption outranks an interrupt), and how often the driver and Ray are asked. No Ray: the fake
context of tests/worker/test_step_sync.py."""

from __future__ import annotations

from raytrainer.worker import stopping
from raytrainer.worker.step_sync import StepSync
from tests.worker.test_step_sync import FakeCtx, FakeEmitter


def test_stop_flags_name_every_asking_rank_and_a_preemption_outranks_an_interrupt(monkeypatch):
    world = 130  # three 62-bit words per kind
    others_preempt = [0] * 6
    for rank in (61, 62, 129):  # ranks on three words
        others_preempt[rank // 62] |= 1 << (rank % 62)
    sync = StepSync(FakeCtx(rank=0, world_size=world, others=[others_preempt]))
    monkeypatch.setattr(stopping, "POLL_S", 0.0)  # ask the driver at every stage
    signals = stopping.StopSignals(sync.ctx, FakeEmitter(), on_ray=False, sync=sync)
    signals._watch = type("Watch", (), {"requested": lambda self: "interrupt"})()  # Ctrl-C on rank 0
    signals.stage()
    sync.exchange()
    assert signals.agreed() == "preemption" and signals.ranks == [61, 62, 129]
    sync.ctx.others = []
    signals.stage()
    sync.exchange()
    assert signals.agreed() == "interrupt" and signals.ranks == [0]


def test_the_driver_and_ray_are_asked_at_most_every_poll_interval_and_sigterm_at_every_step(monkeypatch):
    """stage() runs after every step; its Ray calls (the driver's Ctrl-C, Ray Train's preemption info) at most
    every POLL_S. A SIGTERM, a flag in this process, is read every time."""
    clock = [100.0]
    monkeypatch.setattr(stopping.time, "monotonic", lambda: clock[0])
    asked = []
    monkeypatch.setattr(stopping, "_ray_preemption_pending", lambda: asked.append("ray") or False)
    monkeypatch.setattr(stopping, "install_sigterm_handler", lambda: True)
    sync = StepSync(FakeCtx(world_size=1))
    signals = stopping.StopSignals(sync.ctx, FakeEmitter(), on_ray=True, sync=sync)
    signals._watch = type("Watch", (), {"requested": lambda self: asked.append("driver")})()
    for _ in range(5):  # five steps within one interval
        signals.stage()
        clock[0] += stopping.POLL_S / 10
    assert asked == ["ray", "driver"]
    clock[0] += stopping.POLL_S
    signals.stage()
    assert asked == ["ray", "driver"] * 2
    stopping._sigterm.set()
    try:
        signals.stage()  # within the interval: no Ray call, and the SIGTERM is staged
        sync.exchange()
        assert signals.agreed() == "preemption" and asked == ["ray", "driver"] * 2
    finally:
        stopping._sigterm.clear()
