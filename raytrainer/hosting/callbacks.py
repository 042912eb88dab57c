"""The driver's callbacks of a hosted run: progress, the reporters, the user's own, fed by the job's event
stream (`coordinator/handlers.py` hands them every event).

A hosted job may run several Trainers one after another (SFT, then DPO): each one's train() starts a fresh
state mirror, as HF's state is per train() (`HostedCallbackHandler`). What the callbacks get as `args` is
`callback_args`: a copy of the trainer's own arguments where the driver has them, raytrainer's options beside.
"""

from __future__ import annotations

import copy
import dataclasses
import types
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
    # The trainer's own disable_tqdm, unless given beside it (a script's arguments are not on the driver).
    quiet = options.disable_tqdm if own_args is None or "disable_tqdm" in given else \
        bool(getattr(own_args, "disable_tqdm", options.disable_tqdm))
    progress = PrinterCallback if quiet else ProgressCallback
    handler = HostedCallbackHandler([progress()], callback_args(own_args, options, given), TrainerState())
    for callback in reporter_callbacks(options) + list(callbacks):
        handler.add(callback)
    return handler


def callback_args(own: Any, options: HostedOptions, given: frozenset = frozenset()) -> Any:
    """What the driver's callbacks get as `args`: a copy of the trainer's own arguments object (an SFTConfig:
    what HF's callbacks read), with raytrainer's options where those were given beside the trainer or the object
    lacks the field (the reporters' logging_dir, storage_options: transformers 5 has no logging_dir). For a
    script (no arguments object on the driver), the options, and no output_dir until the first claim. Fields
    set later (output_dir, at a claim) change the copy: the user's object is not changed."""
    values = {f.name: getattr(options, f.name) for f in dataclasses.fields(options)}
    if own is None:
        return types.SimpleNamespace(**values, output_dir=None, to_dict=options.to_dict,
                                     to_json_string=options.to_json_string)
    view = copy.copy(own)
    for name, value in values.items():
        if name in given or not hasattr(own, name):
            setattr(view, name, value)
    return view
