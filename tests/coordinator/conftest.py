"""The coordinator's tests run the event sink's async methods on an asyncio loop, the ranks as coroutines
(tests/coordinator/sink_calls.py)."""

import asyncio

import pytest


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()
