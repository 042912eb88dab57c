"""hosted_sft.py with one part of a hosted rank's per-step work switched off in alternate windows, for
benchmarks/ray_share.py. `--ablate WHAT` comes first, hosted_sft.py's own arguments after it. Under
`raytrainer launch` only: the parts are raytrainer's and Ray's.

    --ablate exchange  the stop exchange (one all-reduce at each of its exchange steps, worker/hosted/stops.py)
                       off in odd blocks of BLOCK steps (every rank counts the same steps, so the collective
                       stays matched on all of them)
    --ablate relay     the relay's per-step HF events (the exchange included) off likewise, except at the steps
                       around a logging step (HF's logs are relayed as usual)
    --ablate park      the Ray worker's main thread parked in even windows of WINDOW_S seconds of wall-clock time
                       (a call to the actor itself sleeping up to 1 s at a time, so Ray Train's polls get through
                       between): Ray's 100 Hz signal check and task loop quiet
    --ablate none      nothing switched: the null result, the method's own noise
"""

from __future__ import annotations

import os
import runpy
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BLOCK = 60  # steps; ray_share.py splits the steps by the same blocks and windows
WINDOW_S = 3.0
LOG_EVERY = 10  # hosted_sft.py's logging_steps


def off(step_begins: int) -> bool:
    """Whether the block of the `step_begins`-th step is an "off" block (odd blocks)."""
    return (step_begins // BLOCK) % 2 == 1


def ablate_exchange():
    from raytrainer.worker.hosted import stops

    begins = [0]
    original = stops.LoopStops.at_step_begin

    def at_step_begin(self):
        begins[0] += 1
        if not off(begins[0]):
            original(self)

    stops.LoopStops.at_step_begin = at_step_begin


def ablate_relay():
    from raytrainer.worker.hosted.relay import Relay

    begins = [0]

    def switched(name: str):
        original = getattr(Relay, name)

        def event(self, args, state, control, **kwargs):
            if name == "on_step_begin":
                begins[0] += 1
            near_a_log = state.global_step % LOG_EVERY in (0, LOG_EVERY - 1)
            if off(begins[0]) and not near_a_log:
                return control
            return original(self, args, state, control, **kwargs)

        return event

    for name in ("on_step_begin", "on_substep_end", "on_pre_optimizer_step", "on_optimizer_step", "on_step_end"):
        setattr(Relay, name, switched(name))


def park_main_thread(done: threading.Event):
    import ray

    me = ray.get_runtime_context().current_actor

    def park(actor, until: float):  # runs on the actor's main thread, which the sleep holds (GIL released)
        time.sleep(max(0.0, until - time.time()))

    while not done.is_set():
        now = time.time()
        window = int(now // WINDOW_S)
        end = (window + 1) * WINDOW_S
        if window % 2 == 0:
            ray.get(me.__ray_call__.remote(park, min(end, now + 1.0)))
        else:
            done.wait(end - now)


def main():
    if sys.argv[1:2] != ["--ablate"] or len(sys.argv) < 3:
        raise SystemExit("usage: hosted_ablate.py --ablate {exchange,relay,park,none} HOSTED_SFT_ARGS...")
    what = sys.argv[2]
    del sys.argv[1:3]
    parking_done = threading.Event()
    parker = threading.Thread(target=park_main_thread, args=(parking_done,), name="ablate-park", daemon=True)
    if what == "exchange":
        ablate_exchange()
    elif what == "relay":
        ablate_relay()
    elif what == "park":
        parker.start()
    elif what != "none":
        raise SystemExit(f"--ablate {what!r}: one of exchange, relay, park, none")
    sys.argv[0] = os.path.join(HERE, "hosted_sft.py")
    try:
        runpy.run_path(sys.argv[0], run_name="__main__")
    finally:
        parking_done.set()  # the job's end: the warm group's next job runs unparked
        if parker.is_alive():
            parker.join()


if __name__ == "__main__":
    main()
