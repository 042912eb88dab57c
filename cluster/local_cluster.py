"""A Ray cluster of several nodes on this machine, for trying multi-node and elastic runs without a cloud.

    python cluster/local_cluster.py start --workers 2 --worker-cpus 1      # head + 2 worker nodes
    python cluster/local_cluster.py status                                   # address and nodes
    python cluster/local_cluster.py add --cpus 1 --resources '{"spot": 1}'  # one more worker node
    python cluster/local_cluster.py remove 1                                 # lose worker node 1 (SIGKILL)
    python cluster/local_cluster.py stop                                     # stop everything it started

Each node is one `ray start --block` process on 127.0.0.1 with its own ports, CPU count and custom
resources, started in its own process group; the script records the groups in a state file and `stop` /
`remove` kill exactly those groups, never another Ray on the machine. `start` prints the address to use:
`RAY_ADDRESS=127.0.0.1:PORT python examples/quickstart.py --num_workers 2 --output_dir /shared/path`.
Ray 2.60 keeps token authentication on: the nodes and the drivers of this machine share the token that
`ray start --head` writes (see docs/deployment.md, "`ray job submit` on a Ray cluster").
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

DEFAULT_STATE_DIR = os.path.join(tempfile.gettempdir(), "raytrainer-local-cluster")
HOST = "127.0.0.1"
# Ports each node opens; on one machine every node needs its own.
NODE_PORTS = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
              "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port")


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


STOP_GRACE_S = 3.0


class LocalCluster:
    """The cluster described by `<state_dir>/cluster.json`: the head's address and each node's process group."""

    def __init__(self, state_dir: str = DEFAULT_STATE_DIR):
        self.state_dir = state_dir
        self.state_file = os.path.join(state_dir, "cluster.json")
        self.state = self._load()

    # ------------------------------------------------------------------ lifecycle
    def start(self, workers: int = 2, head_cpus: int = 1, worker_cpus: int = 1,
              resources: Optional[Dict[str, float]] = None, timeout_s: float = 90) -> str:
        if self.state.get("nodes"):
            raise RuntimeError(f"A local cluster is already running ({self.address}); stop it first: "
                               f"python cluster/local_cluster.py stop --state-dir {self.state_dir}")
        os.makedirs(self.state_dir, exist_ok=True)
        port, dashboard = free_port(), free_port()
        self.state = {"address": f"{HOST}:{port}", "dashboard": f"http://{HOST}:{dashboard}", "nodes": []}
        self._launch(["--head", f"--port={port}", f"--dashboard-port={dashboard}", "--dashboard-host", HOST,
                      f"--num-cpus={head_cpus}", "--num-gpus=0"], role="head")
        self.wait_for_nodes(1, timeout_s)  # workers join a head that answers
        for _ in range(workers):  # one at a time: Ray gives a starting node 30 s to register
            self.add(worker_cpus, resources, timeout_s=timeout_s)
        return self.address

    def add(self, cpus: int = 1, resources: Optional[Dict[str, float]] = None, wait: bool = True,
            timeout_s: float = 60) -> int:
        """Start one more worker node; returns its index (for `remove`). A node that fails to register in
        time (Ray allows 30 s, which a loaded machine can miss) is started once more."""
        extra = [f"--resources={json.dumps(resources)}"] if resources else []
        command = [f"--address={self.address}", f"--num-cpus={cpus}", "--num-gpus=0", *extra]
        index = self._launch(command, role="worker")
        if wait:
            try:
                self.wait_for_nodes(len(self.alive_nodes()), timeout_s)
            except RuntimeError:
                self.state["nodes"][index]["alive"] = False
                index = self._launch(command, role="worker")
                self.wait_for_nodes(len(self.alive_nodes()), timeout_s)
        return index

    def remove(self, index: int):
        """Kill worker node `index` at once (SIGKILL to its process group), as a lost machine would vanish."""
        node = self.state["nodes"][index]
        if node["role"] == "head":
            raise ValueError("Node 0 is the head; removing it ends the cluster: use `stop`.")
        _kill_group(node["pgid"], signal.SIGKILL)
        node["alive"] = False
        self._save()

    def stop(self):
        """Stop every node this cluster started (workers first, then the head), and nothing else."""
        for node in reversed(self.state.get("nodes", [])):
            if node.get("alive", True):
                _kill_group(node["pgid"], signal.SIGTERM)
        # A short grace: `ray start --block` and its GCS do not exit on SIGTERM within 25 s (measured), and
        # nothing of a node outlives it but files in the cluster's own temp dir, removed below.
        deadline = time.time() + STOP_GRACE_S
        for node in self.state.get("nodes", []):
            while _group_alive(node["pgid"]) and time.time() < deadline:
                _reap(node["pid"])
                time.sleep(0.2)
            _kill_group(node["pgid"], signal.SIGKILL)
            _reap(node["pid"])
        for node in self.state.get("nodes", []):  # SIGKILL is delivered asynchronously: return once it took
            while _group_alive(node["pgid"]) and time.time() < deadline + 5:
                time.sleep(0.05)
        if self.state.get("temp_dir"):
            shutil.rmtree(self.state["temp_dir"], ignore_errors=True)
        self.state = {}
        if os.path.exists(self.state_file):
            os.remove(self.state_file)

    # ------------------------------------------------------------------ queries
    @property
    def address(self) -> Optional[str]:
        return self.state.get("address")

    def alive_nodes(self) -> List[dict]:
        return [n for n in self.state.get("nodes", []) if n.get("alive", True) and _group_alive(n["pgid"])]

    def process_groups(self) -> List[int]:
        return [n["pgid"] for n in self.state.get("nodes", [])]

    def wait_for_nodes(self, count: int, timeout_s: float):
        """Block until the head reports `count` alive nodes (checked with `ray status`-like GCS queries)."""
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            if self._alive_in_gcs() >= count:
                return
            dead = [n for n in self.state["nodes"] if n.get("alive", True) and not _group_alive(n["pgid"])]
            if dead:
                raise RuntimeError(f"A node of the local cluster exited at start; its log: {dead[0]['log']}")
            time.sleep(0.5)
        raise TimeoutError(f"The local cluster did not reach {count} nodes in {timeout_s:.0f} s "
                           f"(logs under {self.state_dir}).")

    def _alive_in_gcs(self) -> int:
        code = ("import ray, sys; ray.init(address=sys.argv[1], logging_level='ERROR'); "
                "print(sum(n['Alive'] for n in ray.nodes()))")
        try:
            out = subprocess.run([sys.executable, "-c", code, self.address], capture_output=True, text=True,
                                 timeout=60, env=_node_env())
        except subprocess.TimeoutExpired:
            # A connect to a head still starting can hang past the check's own limit (a fresh virtualenv's first
            # imports, a loaded machine: a CI run's first minute): not up yet, asked again until wait_for_nodes'
            # deadline.
            return 0
        return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else 0

    # ------------------------------------------------------------------ internals
    def _launch(self, args: List[str], role: str) -> int:
        index = len(self.state["nodes"])
        ports = [f"{flag}={free_port()}" for flag in NODE_PORTS]
        log = os.path.join(self.state_dir, f"node-{index}-{role}.log")
        # A temp dir of its own: `ray start` in the default one would name this cluster in
        # /tmp/ray/ray_current_cluster, and a plain `ray.init()` elsewhere on the machine would join it.
        # Short, under /tmp: Ray's socket paths under it must fit in 107 characters.
        temp_dir = self.state.setdefault("temp_dir", tempfile.mkdtemp(prefix="rt-lc-"))
        with open(log, "w") as out:
            process = subprocess.Popen(["ray", "start", "--block", "--disable-usage-stats", f"--temp-dir={temp_dir}",
                                        f"--node-ip-address={HOST}", *ports, *args],
                                       stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                       env={**_node_env(), **(HEAD_HEALTH_CHECKS if role == "head" else {})})
        self.state["nodes"].append({"role": role, "pid": process.pid, "pgid": process.pid, "log": log,
                                    "alive": True})
        self._save()
        return index

    def _load(self) -> dict:
        if os.path.exists(self.state_file):
            with open(self.state_file) as f:
                return json.load(f)
        return {}

    def _save(self):
        with open(self.state_file, "w") as f:
            json.dump(self.state, f, indent=2)


# How fast the head's GCS declares a vanished node dead: every 1 s, after 3 failed checks (Ray's defaults, 3 s and
# 5, took ~15 s). A killed node refuses the check at once, so a loss is seen in ~3 s; a node that is only slow
# still has Ray's 10 s per check to answer. Until then Ray Train counts the lost node and restarts at the old size.
HEAD_HEALTH_CHECKS = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}


def _node_env() -> dict:
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # a node joins the address given on its command line, nothing else
    # The head keeps Ray 2.60's token authentication on and writes ~/.ray/auth_token; nodes and drivers
    # joining it must say they use it (the token file is shared on one machine).
    env.setdefault("RAY_AUTH_MODE", "token")
    return env


def _kill_group(pgid: int, sig: int):
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    """Whether a process of the group still runs (zombies, already dead, do not count)."""
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def _reap(pid: int):
    """Collect the exit status of a node this process started (else it stays a zombie until we exit)."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def main(argv=None):
    parser = argparse.ArgumentParser(description="A multi-node Ray cluster on this machine (see the module doc).")
    parser.add_argument("--state-dir", default=DEFAULT_STATE_DIR, help="where the cluster's state and logs live")
    sub = parser.add_subparsers(dest="command", required=True)
    start = sub.add_parser("start", help="start a head and worker nodes; prints the address")
    start.add_argument("--workers", type=int, default=2)
    start.add_argument("--head-cpus", type=int, default=1)
    start.add_argument("--worker-cpus", type=int, default=1)
    start.add_argument("--resources", type=json.loads, default=None, help='custom resources per worker node, JSON')
    add = sub.add_parser("add", help="add a worker node")
    add.add_argument("--cpus", type=int, default=1)
    add.add_argument("--resources", type=json.loads, default=None)
    remove = sub.add_parser("remove", help="kill worker node INDEX (as `status` numbers them)")
    remove.add_argument("index", type=int)
    sub.add_parser("stop", help="stop every node this cluster started")
    sub.add_parser("status", help="address and nodes")
    opts = parser.parse_args(argv)
    cluster = LocalCluster(opts.state_dir)
    if opts.command == "start":
        print(cluster.start(opts.workers, opts.head_cpus, opts.worker_cpus, opts.resources))
    elif opts.command == "add":
        print(f"node {cluster.add(opts.cpus, opts.resources)} started")
    elif opts.command == "remove":
        cluster.remove(opts.index)
        print(f"node {opts.index} killed")
    elif opts.command == "stop":
        cluster.stop()
        print("stopped")
    else:
        print(json.dumps({"address": cluster.address, "nodes": cluster.state.get("nodes", []),
                          "alive": [n["pid"] for n in cluster.alive_nodes()]}, indent=2))


if __name__ == "__main__":
    main()
