"""Callback state in checkpoints (transformers' `ExportableState`), and restore_callback_states_from_checkpoint.

A callback with a `state()` method (EarlyStoppingCallback) exports `{"args": ..., "attributes": ...}`;
checkpoints keep those in trainer_state.json's `stateful_callbacks`, under the class name (a list when several
instances), as transformers writes them. The callbacks run on the driver and the checkpoint is written by
rank 0, so the states travel with the driver's control decisions (`CallbackHandler.take_control`): a
callback that can change control is consulted after the events it listens to, so its state is current when
the loop saves after them.

With restore_callback_states_from_checkpoint=True, resuming rebuilds each such callback from the checkpoint:
`type(callback)(**args)`, then its attributes set, replacing the instance passed to the Trainer (as
transformers does). Stored states of callbacks this Trainer does not have are ignored, with a warning.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List

from ..state import OWN_STATE_KEY

logger = logging.getLogger("raytrainer")

# The key of a control decision that carries the driver callbacks' states to rank 0.
STATES_KEY = "stateful_callbacks"
# Set on a restored callback, for callbacks whose on_train_begin would otherwise reset what was restored.
RESTORED = "_restored_from_checkpoint"


def export_states(callbacks: List[Any]) -> Dict[str, Any]:
    states: Dict[str, list] = {}
    for callback in callbacks:
        if callable(getattr(callback, "state", None)) and type(callback).__name__ != OWN_STATE_KEY:
            states.setdefault(type(callback).__name__, []).append(callback.state())
    return {name: found[0] if len(found) == 1 else found for name, found in states.items()}


def restore_states(handler, stored: Dict[str, Any]) -> None:
    """Replace the handler's callbacks that have a stored state by ones rebuilt from it."""
    stored = {k: v for k, v in (stored or {}).items() if k not in (OWN_STATE_KEY, "TrainerControl")}
    missing = []
    for name, data in stored.items():
        current = [c for c in handler.callbacks if type(c).__name__ == name]
        if not current:
            missing.append(name)
            continue
        for callback, saved in zip(current, data if isinstance(data, list) else [data]):
            rebuilt = type(callback)(**saved.get("args", {}))
            for attribute, value in saved.get("attributes", {}).items():
                setattr(rebuilt, attribute, value)
            setattr(rebuilt, RESTORED, True)
            handler.callbacks[handler.callbacks.index(callback)] = rebuilt
    if missing:
        logger.warning("The checkpoint holds the state of callbacks this Trainer does not have (%s): ignored.",
                       ", ".join(missing))

