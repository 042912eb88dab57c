"""The driver's callbacks of a hosted run: progress, the reporters, the user's own, fed by the job's event
stream (`coordinator/handlers.py` hands them every event).

A hosted job may run several Trainers one after another (SFT, then DPO): each one's train() starts a fresh
state mirror, as HF's state is per train() (`HostedCallbackHandler`). What the callbacks get as `args` is
`CallbackArgs`: the trainer's own arguments where the driver has them, raytrainer's options beside.
"""

from __future__ import annotations

from typing import Any, Dict, Iterable

from ..callbacks.base import CallbackHandler
from ..callbacks.progress import PrinterCallback, ProgressCallback
from ..callbacks.reporters import reporter_callbacks
from ..state import TrainerState
from .options import HostedOptions


class HostedCallbackHandler(CallbackHandler):
    """raytrainer's callback handler, with a fresh state mirror at each Trainer's train_begin."""

    def handle(self, event: Dict[str, Any]):
        if event["kind"] == "train_begin":
            self.state = TrainerState()
        super().handle(event)


def driver_callbacks(options: HostedOptions, own_args: Any = None, given: frozenset = frozenset(),
                     callbacks: Iterable[Any] = ()) -> HostedCallbackHandler:
    """The handler of a hosted run's driver callbacks: progress (a bar, or lines with disable_tqdm), the
    reporters `options` name, then `callbacks`. `own_args`: the trainer's arguments object (None: a script's,
    which stay on the workers); `given`: the options given beside the trainer (they win over its arguments)."""
    progress = PrinterCallback if options.disable_tqdm else ProgressCallback
    handler = HostedCallbackHandler([progress()], CallbackArgs(own_args, options, given), TrainerState())
    for callback in reporter_callbacks(options) + list(callbacks):
        handler.add(callback)
    return handler


class CallbackArgs:
    """What the driver's callbacks get as `args`: the trainer's own arguments object (an SFTConfig: what HF's
    callbacks read), with raytrainer's options where those were given beside the trainer or the object lacks
    the field (the reporters' logging_dir, storage_options: transformers 5 has no logging_dir). Set fields
    stay here (output_dir, once a Trainer claims it): the user's object is not changed."""

    def __init__(self, own: Any, options: HostedOptions, given: frozenset = frozenset()):
        set_here: Dict[str, Any] = {} if own is not None else {"output_dir": None}  # until the first claim
        object.__setattr__(self, "_sources", (own, options, given, set_here))

    def __getattr__(self, name: str):
        own, options, given, set_here = object.__getattribute__(self, "_sources")
        if name in set_here:
            return set_here[name]
        if name in given or own is None or not hasattr(own, name):
            return getattr(options, name)
        return getattr(own, name)

    def __setattr__(self, name: str, value: Any):
        object.__getattribute__(self, "_sources")[3][name] = value
