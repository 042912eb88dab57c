"""The queue of messages from the workers to the driver, and the request/answer exchanges on it.

Workers append (`put`); the driver's pump takes everything so far (`take`). A request (a control request, a
hosted claim) is queued after the events rank 0 sent with it, and its answer is a future that the driver
resolves (`answer`) once it has handled them: so a decision reflects every event up to that point. Ray does
not promise that an async actor starts one caller's calls in order; the worker's emitter waits for its earlier
pushes before it asks (`callbacks/channel.py`).
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence


class EventStream:
    def __init__(self, request_ids: Optional[Iterator[int]] = None):
        self._queue: List[Any] = []
        self._arrived = asyncio.Event()
        self._answers: Dict[int, asyncio.Future] = {}  # request id -> its answer, once the driver gives it
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

    async def ask(self, messages: Sequence[Any], request_of: Callable[[int], Any]) -> Any:
        """Queue `messages` and the request `request_of(id)` after them (a `ControlRequest`, a `ClaimRequest`);
        return the driver's answer to it."""
        request = next(self._request_ids)
        future = asyncio.get_running_loop().create_future()
        self._answers[request] = future
        self.put(list(messages) + [request_of(request)])
        try:
            return await future
        finally:
            self._answers.pop(request, None)

    def answer(self, request: int, reply: Any) -> bool:
        """Answer request `request` (an answer to a request nobody waits for any more is dropped)."""
        future = self._answers.get(request)
        if future is not None and not future.done():
            future.set_result(reply)
        return True
