"""A real `ray job submit` of an example to a real Ray head on loopback with token authentication on.

The head is this module's own: a temporary HOME holds its token (`~/.ray/auth_token`), a separate `--temp-dir`
its session files and address file, and free ports are chosen for everything it listens on, so the suite's
session Ray and the user's `~/.ray` are untouched. Every process the head spawns inherits RAY_TMPDIR, the head's
own temporary folder; teardown stops exactly those (never `ray stop`, which would stop every Ray on the machine)
and checks that none is left.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest

from raytrainer.checkpoint.listing import list_checkpoints
from raytrainer.checkpoint.manifest import is_committed
from tests.support import ROOT, free_ports, wait_for

RAY = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray") or "ray"

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="finding the test head's processes (by their "
                                "environment) reads /proc, which only Linux has")


def _head_pids(root: str) -> list[int]:
    """Live processes whose environment carries the head's own `RAY_TMPDIR=root` (Linux /proc; zombies have no
    environ). Ray 2.60 starts the dashboard agent without variables of the test's own (a marker variable missed
    it), and an agent left behind spins at half a core for a minute or more, slowing every later test."""
    needle = f"RAY_TMPDIR={root}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(entry))
        except OSError:  # gone, or not ours
            continue
    return pids


def _stop(root: str, grace: float = 3.0) -> list[int]:
    """SIGTERM the head's processes, SIGKILL what is left after `grace` s; returns the pids still alive."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        for pid in _head_pids(root):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        wait_for(lambda: not _head_pids(root), wait, every_s=0.2)
    return _head_pids(root)


class Head:
    def __init__(self, root: str):
        self.root = root
        self.gcs_port, self.dashboard_port, *self.other_ports = free_ports(7)
        self.address = f"http://127.0.0.1:{self.dashboard_port}"
        self.home = os.path.join(root, "home")
        os.makedirs(os.path.join(self.home, ".ray"))
        with open(os.path.join(self.home, ".ray", "auth_token"), "w") as f:
            f.write(secrets.token_hex(32))

    def env(self, home: str | None = None, **extra) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}  # no RAY_ADDRESS, no auth override
        env.update(HOME=home or self.home, RAY_TMPDIR=self.root, PYTHONPATH=ROOT, RAY_TRAIN_V2_ENABLED="1",
                   RAY_USAGE_STATS_ENABLED="0", **extra)
        return env

    def start(self):
        client, agent, agent_grpc, runtime_env, metrics = self.other_ports
        cmd = [RAY, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(self.gcs_port),
               "--dashboard-host", "127.0.0.1", "--dashboard-port", str(self.dashboard_port),
               "--ray-client-server-port", str(client), "--dashboard-agent-listen-port", str(agent),
               "--dashboard-agent-grpc-port", str(agent_grpc), "--runtime-env-agent-port", str(runtime_env),
               "--metrics-export-port", str(metrics), "--num-cpus", "3", "--num-gpus", "0",
               "--temp-dir", os.path.join(self.root, "ray"), "--disable-usage-stats"]
        # RAY_AUTH_MODE=token as Ray 2.60 wants it on clusters; the token comes from HOME/.ray/auth_token.
        run = subprocess.run(cmd, env=self.env(RAY_AUTH_MODE="token"), capture_output=True, text=True,
                             timeout=120)
        assert run.returncode == 0, run.stdout + run.stderr

    def job(self, verb: str, *args: str, home: str | None = None, auth: bool = True, timeout: float = 240):
        env = self.env(home=home, **({"RAY_AUTH_MODE": "token"} if auth else {}))
        env.pop("RAY_TMPDIR")  # the CLI client is the test's, not the head's
        return subprocess.run([RAY, "job", verb, "--address", self.address, *args], env=env, capture_output=True,
                              text=True, timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def head():
    # Short, private paths: Ray's Unix sockets live under --temp-dir and must stay under ~107 bytes.
    root = tempfile.mkdtemp(prefix="rtjob", dir="/tmp")
    head = Head(root)
    try:
        head.start()
        yield head
    finally:
        left = _stop(root)
        shutil.rmtree(root, ignore_errors=True)
        assert left == [], f"processes of the test's Ray head still running: {left}"


def test_ray_job_submit_of_an_example_with_two_workers(head, tmp_path):
    output_dir = str(tmp_path / "run")
    submit = head.job("submit", "--submission-id", "raytrainer-seqcls", "--working-dir", ROOT, "--",
                      "python", "examples/sequence_classification.py", "--num_workers", "2", "--max_steps", "4",
                      "--save_steps", "2", "--logging_steps", "2", "--eval_strategy", "no", "--disable_tqdm",
                      "--output_dir", output_dir)
    status = head.job("status", "raytrainer-seqcls", timeout=60)
    assert "job 'raytrainer-seqcls' succeeded" in status.stdout.lower(), submit.stdout[-3000:] + submit.stderr[-3000:]
    assert submit.returncode == 0
    assert "trained 4 steps on 2 workers" in submit.stdout
    infos = list_checkpoints(output_dir)
    assert [(i.step, i.committed) for i in infos] == [(2, True), (4, True)]
    assert all(is_committed(i.url) for i in infos)


def test_submitting_without_the_token_is_refused(head, tmp_path):
    """What a user sees who forgot RAY_AUTH_MODE=token and the token (README: "ray job submit" on a cluster)."""
    empty_home = str(tmp_path / "home")
    os.makedirs(empty_home)
    refused = head.job("submit", "--", "python", "-c", "print('never runs')", home=empty_home, auth=False,
                       timeout=60)
    assert refused.returncode != 0
    out = refused.stdout + refused.stderr
    assert "Unauthorized: Missing authentication token" in out and "RAY_AUTH_TOKEN" in out, out[-2000:]
    assert "never runs" not in out
    listing = head.job("list", timeout=60)  # with the token, the same client is let in
    assert listing.returncode == 0 and "raytrainer-seqcls" in listing.stdout
