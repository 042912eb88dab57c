"""The queue of messages from the workers to the driver, and the control exchange on it.

Workers append (`put`); the driver's pump takes everything so far (`take`). A control request is queued
after the events rank 0 sent with it, and its decision is a future that the driver resolves (`decide`) once
it has handled them: so a decision reflects every event up to that point. Ray does not promise that an async
actor starts one caller's calls in order; the worker's emitter waits for its earlier pushes before it asks
(`callbacks/channel.py`).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Dict, Iterator, List, Optional, Sequence

from ..protocol import ControlRequest, Decision


class EventStream:
    def __init__(self, request_ids: Optional[Iterator[int]] = None):
        self._queue: List[Any] = []
        self._arrived = asyncio.Event()
        self._decisions: Dict[int, asyncio.Future] = {}
        self._request_ids = request_ids if request_ids is not None else itertools.count()

    def clear(self):
        """Drop what is queued: a finished job's stragglers (a new job starts)."""
        self._queue = []

    def put(self, messages: Sequence[Any]) -> int:
        self._queue.extend(messages)
        self._arrived.set()
        return len(messages)

    async def take(self, timeout_s: float) -> List[Any]:
        """Every message so far; waits up to `timeout_s` for one when there is none."""
        if not self._queue:
            try:
                await asyncio.wait_for(self._arrived.wait(), timeout_s)
            except asyncio.TimeoutError:
                pass
        messages, self._queue = self._queue, []
        self._arrived.clear()
        return messages

    async def ask(self, messages: Sequence[Any], job: Optional[str] = None) -> Decision:
        """Queue `messages` and a control request after them; return the driver's decision on it."""
        request = next(self._request_ids)
        future = asyncio.get_running_loop().create_future()
        self._decisions[request] = future
        self.put(list(messages) + [ControlRequest(id=request, job=job)])
        try:
            return await future
        finally:
            self._decisions.pop(request, None)

    def decide(self, request: int, decision: Decision) -> bool:
        """Answer request `request` (an answer to a request nobody waits for any more is dropped)."""
        future = self._decisions.get(request)
        if future is not None and not future.done():
            future.set_result(decision)
        return True
