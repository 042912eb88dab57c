"""One writer per output_dir (issue 20, 3): the lease is taken with a conditional write, a live holder is named
and refused, a stale one is taken over with a message, and a worker that finds the lease gone or taken stops.
Each test on local disk and on S3 (moto)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from raytrainer import storage
from raytrainer.checkpoint import lease
from raytrainer.storage.errors import StorageLostError


def _plant(store, run_id: str, pid: int, heartbeat: float, host: str | None = None):
    """A lease as another driver would have written it."""
    record = {"run_id": run_id, "host": host or socket.gethostname(), "pid": pid, "started": heartbeat,
              "heartbeat": heartbeat}
    storage.write_bytes(lease.lease_url(store.url), json.dumps(record).encode(), store.options)


@pytest.fixture
def other_driver():
    """A live process standing for another driver on this host."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc.pid
    proc.kill()
    proc.wait()


def test_take_refuse_release(store, other_driver):
    held = lease.acquire(store.url, "run-a", store.options, heartbeat=False)
    lease.check_held(store.url, "run-a", store.options)
    with pytest.raises(lease.LeaseHeldError, match="run 'run-a'"):  # a second run in this process
        lease.acquire(store.url, "run-b", store.options, heartbeat=False)
    held.release()
    assert not storage.exists(lease.lease_url(store.url), store.options)

    _plant(store, "run-x", other_driver, time.time())
    with pytest.raises(lease.LeaseHeldError, match=rf"run 'run-x' \(driver pid {other_driver} on host"):
        lease.acquire(store.url, "run-b", store.options, heartbeat=False)


def test_stale_or_dead_holder_is_taken_over_with_a_message(store, other_driver, capfd):
    _plant(store, "run-old", other_driver, time.time() - 3600, host="elsewhere")
    held = lease.acquire(store.url, "run-new", store.options, heartbeat=False)
    assert "took over output_dir" in capfd.readouterr().err
    lease.check_held(store.url, "run-new", store.options)
    held.release()

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    _plant(store, "run-dead", dead.pid, time.time())  # fresh heartbeat, but its process is gone
    held = lease.acquire(store.url, "run-new", store.options, heartbeat=False)
    assert f"its driver (pid {dead.pid}) is no longer running" in capfd.readouterr().err
    held.release()


def test_heartbeat_refreshes_and_a_worker_sees_loss_or_takeover(store):
    held = lease.acquire(store.url, "run-a", store.options, heartbeat=False)
    held.start_heartbeat(interval_s=0.2)
    first = json.loads(storage.read_bytes(lease.lease_url(store.url), store.options))["heartbeat"]
    deadline = time.time() + 20
    while json.loads(storage.read_bytes(lease.lease_url(store.url), store.options))["heartbeat"] == first:
        assert time.time() < deadline, "the heartbeat never refreshed the lease"
        time.sleep(0.1)
    held.release()

    held = lease.acquire(store.url, "run-a", store.options, heartbeat=False)
    _plant(store, "run-b", 1, time.time(), host="elsewhere")  # another run took over
    with pytest.raises(lease.LeaseLostError, match="taken over by run 'run-b'"):
        lease.check_held(store.url, "run-a", store.options)
    storage.remove(lease.lease_url(store.url), storage_options=store.options)  # storage emptied
    with pytest.raises(StorageLostError, match="lease under output_dir=.* is gone"):
        lease.check_held(store.url, "run-a", store.options)
    held.release()


def test_two_racing_takers_one_wins(store, tmp_path):
    """Conditional writes: of two drivers starting together, exactly one takes the lease."""
    code = ("import os, sys, time; from raytrainer.checkpoint import lease\n"
            "open(os.path.join(sys.argv[3], sys.argv[2]), 'w').close()\n"
            "while len(os.listdir(sys.argv[3])) < 2: time.sleep(0.01)\n"  # all imported: start together
            "try:\n    lease.acquire(sys.argv[1], sys.argv[2], OPTS, heartbeat=False); print('WON', flush=True)\n"
            "except lease.LeaseHeldError:\n    print('REFUSED', flush=True)\n"
            "sys.stdin.read()\n").replace("OPTS", repr(store.options))  # hold on until every one answered
    ready = tmp_path / "ready"
    ready.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", code, store.url, f"run-{i}", str(ready)], text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE) for i in range(2)]
    try:
        outcomes = sorted(p.stdout.readline().strip() for p in procs)
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=60)
    assert outcomes == ["REFUSED", "WON"]
