"""Elastic runs and preemption on a real multi-node Ray cluster on this machine (cluster/local_cluster.py):
a head without CPUs and two 1-CPU worker nodes, so each worker of a 2-worker group has a node of its own.

- num_workers=(1, 2): a node is removed mid-run, the run continues with 1 worker from the newest committed
  checkpoint; the node comes back, and Ray Train's elastic monitor grows the run to 2 workers again.
- then a worker of the regrown group receives SIGTERM: every rank saves at the next step boundary, Ray Train
  restarts the group as a preemption (max_failures=1, spent by the node loss, so a counted failure would end
  the run).
The weights equal an uninterrupted run's with the same global batch, and every sample is used once per epoch.
(The preemption was a run of its own, with a driver and a group start more.)

The first phase of the shrink-grow run is also the check of the local cluster script itself: a 2-worker run
across its two worker nodes (one worker on each); the fixture checks that stopping the cluster leaves none of
its processes behind.

The drivers run in their own processes (`elastic_script.py`), joining the cluster through RAY_ADDRESS; the
cluster is shared by the package's tests (conftest.py).
"""

import glob
import json
import os
import subprocess
import sys
import time
from collections import defaultdict

import pytest
import torch

from raytrainer import Trainer
from raytrainer.checkpoint.listing import list_checkpoints
from tests.integration.cluster import elastic_script as script
from tests.integration.cluster.conftest import ROOT, unreserved_cpus
from tests.models import TokenData, assert_same_weights, make_model, weights

WAIT_S = 240


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run in one process: batch 4 x accumulation 2 = the elastic run's global batch of 8."""
    args = script.training_args(str(tmp_path_factory.mktemp("ref") / "run"), "reference")
    args.num_workers, args.gradient_accumulation_steps, args.save_strategy = 0, 2, "no"
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(script.SAMPLES))
    trainer.train()
    return weights(trainer.model)


def _driver(cluster, work, scenario):
    env = {**os.environ, "RAY_ADDRESS": cluster.address, "RAY_AUTH_MODE": "token", "PYTHONPATH": ROOT,
           # A restart right after a node loss first asks for the old size; give up on it after 10 s, not 60.
           "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "10"}
    return subprocess.Popen([sys.executable, "-m", "tests.integration.cluster.elastic_script", str(work), scenario],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _wait_for(path, proc):
    deadline = time.time() + WAIT_S
    while not os.path.exists(path):
        assert proc.poll() is None, f"the driver ended before {path.name}:\n{proc.stdout.read()[-4000:]}"
        assert time.time() < deadline, f"{path.name} never appeared"
        time.sleep(0.2)


def _finish(proc):
    out, _ = proc.communicate(timeout=WAIT_S)
    assert proc.returncode == 0, out[-4000:]
    return out


def _last_run_of_each_step(work):
    """step -> the records of the worker group that ran it last (earlier runs were rolled back)."""
    records = [json.loads(line) for path in glob.glob(str(work / "seen-*.jsonl")) for line in open(path)]
    groups = defaultdict(list)  # (step, world, start) -> records
    for r in records:
        groups[(r["step"], r["world"], r["start"])].append(r)
    last = {}
    for (step, _, _), rs in groups.items():
        if step not in last or max(r["time"] for r in rs) > max(r["time"] for r in last[step]):
            last[step] = rs
    return last


def _assert_each_sample_once_per_epoch(work):
    last = _last_run_of_each_step(work)
    assert sorted(last) == list(range(1, script.STEPS + 1))
    per_epoch = script.SAMPLES // 8
    for epoch in range(script.STEPS // per_epoch):
        ids = [i for step in range(epoch * per_epoch + 1, (epoch + 1) * per_epoch + 1)
               for r in last[step] if not r["padding"] for i in r["idx"]]
        assert sorted(ids) == list(range(script.SAMPLES)), f"epoch {epoch}: samples not used exactly once"
    return last


def test_elastic_run_shrinks_on_node_loss_grows_back_and_resumes_a_sigterm_as_a_preemption_exact(
        cluster, reference, tmp_path):
    proc = _driver(cluster, tmp_path, "shrink-grow")
    _wait_for(tmp_path / "paused-2", proc)  # 2 workers at step 5, checkpoint-4 committed
    cluster.remove(1)  # a worker node vanishes
    _wait_for(tmp_path / "paused-1", proc)  # continued with 1 worker, at step 9, checkpoint-8 committed
    cluster.add(cpus=1)  # capacity returns: the elastic monitor (every 2 s here) grows the group
    assert len(cluster.alive_nodes()) == 3  # the head and two worker nodes again
    out = _finish(proc)  # grown back to 2: rank 1 sends itself SIGTERM during step 13

    result = torch.load(tmp_path / "result.pt")
    assert result["global_step"] == script.STEPS
    assert_same_weights(result["weights"], reference)
    last = _assert_each_sample_once_per_epoch(tmp_path)
    assert [last[s][0]["world"] for s in (1, 5, 8, 9, 12, script.STEPS)] == [2, 1, 1, 2, 2, 2]
    # The local cluster script's nodes are real: the 2-worker group ran one worker on each worker node (the
    # head has no CPU).
    assert len({r["node"] for r in last[1]}) == 2

    shrink, grow = result["resizes"]  # the preemption is no resize
    assert (shrink["previous_world_size"], shrink["world_size"]) == (2, 1)
    assert shrink["checkpoint"].endswith("checkpoint-4") and shrink["gradient_accumulation_steps"] == 2
    assert "rank" in shrink["cause"]  # the worker failure Ray Train reported
    assert (grow["previous_world_size"], grow["world_size"]) == (1, 2)
    assert grow["checkpoint"].endswith("checkpoint-8") and grow["gradient_accumulation_steps"] == 1
    assert "elastic monitor" in grow["cause"]
    assert [r["reason"] for r in result["restarts"]] == ["failure", "resize", "preemption"]
    # The final checkpoint records both resizes in its trainer_state.json.
    final = json.load(open(tmp_path / "run" / f"checkpoint-{script.STEPS}" / "trainer_state.json"))
    assert len(final["stateful_callbacks"]["raytrainer"]["resizes"]) == 2

    # The preemption: saved at the boundary of the step the SIGTERM came in (13), or of one of the next two, none
    # a step of a periodic save (save_steps=4: only the preemption wrote it), committed, and the group
    # restarted from it.
    assert os.path.exists(tmp_path / "sigterm-sent")
    saved = {c.step: c.committed for c in list_checkpoints(str(tmp_path / "run"))}
    preempted_at = result["restarts"][-1]["global_step"]
    assert script.SIGTERM_AT <= preempted_at < script.STEPS and preempted_at % script.SAVE_STEPS, preempted_at
    assert saved[preempted_at], saved
    restart = result["restarts"][-1]
    assert "rank 1" in restart["cause"] and restart["checkpoint"].endswith(f"checkpoint-{preempted_at}")
    assert "preemption" in out  # the driver showed it

    # The driver's exit aborted its warm group through Ray Train (coordinator/group.py): the group's request to
    # Ray's AutoscalingCoordinator went with it. Killed without the abort, the request held both worker nodes'
    # CPUs for 180 s, and the next elastic run on the cluster waited that long before its first step.
    assert unreserved_cpus(cluster, 2) == 2
