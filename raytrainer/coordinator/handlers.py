"""Who takes a job's messages on the driver: `JobHandlers`, what the pump (`pump.py`) and, for
`num_workers=0`, the `DirectSink` hand each message to, by its kind (`protocol.Kind`):

- an `Event`: train()'s start-up watch reads its own (`StartupWatch`), the callbacks get the rest;
- a `ControlRequest`: the callbacks' flags and states since the last one (`decide`);
- a `ClaimRequest`: the claim handler's reply (`answer_claim`), the hosted mode's (hosting/hosted_handler.py).

Each part is named: the pump calls typed methods, never probes a handler for what it may have.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Protocol

from ..callbacks.base import CallbackHandler
from ..callbacks.stateful import STATES_KEY
from ..protocol import Decision, HostedClaim, HostedClaimReply
from ..startup import Startup

logger = logging.getLogger("raytrainer")


class ClaimHandler(Protocol):
    """What answers a hosted Trainer's claim of its output_dir (`hosting.hosted_handler.HostedHandler`)."""

    def answer_claim(self, claim: HostedClaim) -> HostedClaimReply: ...


class StartupWatch:
    """train()'s start-up timeline (`startup.py`) beside the event stream: rank 0's startup event is read here
    (not dispatched); the first step_end completes the timeline, which is then logged at INFO as one line and
    set as the driver's `state.startup`."""

    def __init__(self, startup: Startup):
        self.startup = startup
        self.logged = False

    def reads(self, event: Dict[str, Any], callbacks: CallbackHandler) -> bool:
        """Whether `event` was the watch's own (then the callbacks do not see it)."""
        if self.startup.on_event(event):
            return True
        if self.startup.complete:
            self.log(callbacks)
        return False

    def log(self, callbacks: CallbackHandler):
        if self.logged or self.startup.words_only:
            return
        self.logged = True
        logger.info("%s", self.startup.line())
        callbacks.state.startup = self.startup.record()


class JobHandlers:
    """The driver's handlers of one job: `callbacks` (events, control decisions), `claims` (a hosted job's
    claims; None: the job makes none) and `startup` (train()'s start-up watch, or None)."""

    def __init__(self, callbacks: CallbackHandler, claims: Optional[ClaimHandler] = None,
                 startup: Optional[StartupWatch] = None):
        self.callbacks, self.claims, self.startup = callbacks, claims, startup

    def handle_event(self, event: Dict[str, Any]):
        if self.startup is not None and self.startup.reads(event, self.callbacks):
            return
        self.callbacks.handle(event)

    def decide(self) -> Decision:
        """The driver callbacks' flags since the last decision, and their states (`CallbackHandler.take_control`)."""
        taken = dict(self.callbacks.take_control())
        states = taken.pop(STATES_KEY, None) or {}
        return Decision(flags=taken, states=states)

    def answer_claim(self, claim: HostedClaim) -> HostedClaimReply:
        if self.claims is None:  # a claim reaches only a hosted job's driver; answered, so rank 0 does not hang
            return HostedClaimReply(error="This job takes no claim of an output_dir: a hosted Trainer must be run "
                                          "by raytrainer.hosted(...) or `raytrainer launch`.")
        return self.claims.answer_claim(claim)
