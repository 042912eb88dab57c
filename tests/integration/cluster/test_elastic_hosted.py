"""An elastic hosted run on the local multi-node cluster: `raytrainer launch --num_workers 1-2` of a plain
transformers.Trainer script (tests/hosted/plain_script.py), checkpoints on S3 (moto on loopback: a local path is
refused on several nodes). A worker node is removed while rank 0 sits in step 8's save; the job continues with
one worker from checkpoint-4, the newest committed one, and ends at max_steps. The script keeps its own
arguments, so its global batch halves: the resize line says so (the own loop's keeps it, test_elastic.py)."""

import json
import os
import subprocess
import sys
import time

from raytrainer import storage
from raytrainer.checkpoint.listing import list_checkpoints
from tests.integration.cluster.conftest import ROOT

SCRIPT = os.path.join(ROOT, "tests", "hosted", "plain_script.py")
MAX_STEPS, SAVE_STEPS, PAUSE_AT = 16, 4, 8
WAIT_S = 240


def test_a_hosted_run_loses_a_node_and_continues_with_one_worker_from_its_last_checkpoint(
        cluster, s3_bucket, s3_server, tmp_path):
    url, options = s3_bucket + "/hosted-elastic", dict(s3_server.storage_options)
    flags = [f"--storage_options={key}={value}" for key, value in
             (("endpoint_url", options["endpoint_url"]), ("key", options["key"]), ("secret", options["secret"]),
              ("client_kwargs.region_name", options["client_kwargs"]["region_name"]))]
    command = [sys.executable, "-m", "raytrainer", "launch", "--num_workers", "1-2", "--max_failures", "1",
               "--disable_tqdm", *flags, SCRIPT, "--output_dir", url, "--results", str(tmp_path / "results"),
               "--max_steps", str(MAX_STEPS), "--save_steps", str(SAVE_STEPS), "--pause_at", str(PAUSE_AT),
               "--pause_s", "10", "--pause_marker", str(tmp_path / "paused")]
    env = {**os.environ, "RAY_ADDRESS": cluster.address, "RAY_AUTH_MODE": "token", "PYTHONPATH": ROOT,
           # A restart right after a node loss first asks for the old size; give up on it after 10 s, not 60.
           "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "10"}
    proc = subprocess.Popen(command, cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    try:
        deadline = time.monotonic() + WAIT_S
        # Rank 0 pauses in step 8's save (once: the marker), after checkpoint-4 was committed. The pause is short:
        # when the node lost holds rank 1, the sleeping rank 0 delays the group's teardown until it wakes.
        while not os.path.exists(tmp_path / "paused"):
            assert proc.poll() is None, proc.stdout.read()[-4000:]
            assert time.monotonic() < deadline, "the run never reached step 8"
            time.sleep(0.2)
        alive = [n["pgid"] for n in cluster.alive_nodes()]
        cluster.remove([i for i, n in enumerate(cluster.state["nodes"])
                        if n["role"] == "worker" and n["pgid"] in alive][-1])  # a node vanishes, with a worker
        out, _ = proc.communicate(timeout=WAIT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
        cluster.add(cpus=1)  # the package's tests share the cluster: two worker nodes again
    assert proc.returncode == 0, out[-4000:]

    assert "worker group restarted with 1 worker at step 4 from checkpoint-4 (failure)" in out, out[-4000:]
    assert "(failure 1, max_failures=1)" in out
    assert ("resized 2 -> 1 workers at step 4; the script's gradient_accumulation_steps stays 1: the global batch "
            "is 1/2 of what it was") in out
    saved = {c.step: c.committed for c in list_checkpoints(url, options)}
    assert saved == {4: True, 8: True, 12: True, 16: True}, saved  # step 8 saved again by the 1-worker group
    state = json.loads(storage.read_text(storage.join(url, f"checkpoint-{MAX_STEPS}", "trainer_state.json"),
                                         options))
    assert state["global_step"] == MAX_STEPS
    [restart] = state["stateful_callbacks"]["raytrainer"]["restarts"]
    assert (restart["reason"], restart["previous_world_size"], restart["world_size"]) == ("failure", 2, 1)
    [resize] = state["stateful_callbacks"]["raytrainer"]["resizes"]
    assert resize["checkpoint"].endswith("checkpoint-4") and resize["same_global_batch"] is False
    history = json.load(open(tmp_path / "results" / "log_history.json"))
    # Steps 1-4 from checkpoint-4's state, 5-16 by the one-worker group: none lost, none twice.
    assert [h["step"] for h in history if "loss" in h] == list(range(1, MAX_STEPS + 1))
