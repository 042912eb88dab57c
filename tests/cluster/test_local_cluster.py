"""The local multi-node cluster script: a head and two worker nodes on loopback, a 2-worker run that trains
across them (one worker per node); the cluster fixture (conftest.py) checks that stopping it leaves none of
its processes behind."""

import json
import os
import subprocess
import sys


from tests.cluster.conftest import ROOT

DRIVER = """
import json, os, sys
import ray
from raytrainer import Trainer, TrainingArguments
from tests.models import TokenData, make_model

class WhereAmI(Trainer):
    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.state.global_step == 0:
            with open(os.path.join(self.where, f"rank{self.ctx.rank}.json"), "w") as f:
                json.dump({"node": ray.get_runtime_context().get_node_id()}, f)
        return super().training_step(model, inputs, num_items_in_batch=num_items_in_batch)

args = TrainingArguments(output_dir=sys.argv[1], num_workers=2, max_steps=4, per_device_train_batch_size=4,
                         save_steps=4, disable_tqdm=True, allow_local_output_dir_on_multinode=True)
trainer = WhereAmI(model=make_model(), args=args, train_dataset=TokenData(32))
trainer.where = sys.argv[2]
print(trainer.train().global_step)
"""


def test_a_two_worker_run_trains_across_two_worker_nodes(cluster, tmp_path):
    assert len(cluster.alive_nodes()) == 3
    env = {**os.environ, "RAY_ADDRESS": cluster.address, "RAY_AUTH_MODE": "token", "PYTHONPATH": ROOT}
    result = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path / "run"), str(tmp_path)], cwd=ROOT,
                            env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "4"
    nodes = {json.load(open(tmp_path / f"rank{r}.json"))["node"] for r in (0, 1)}
    assert len(nodes) == 2  # the head has no CPU: one worker on each worker node
    assert os.path.exists(tmp_path / "run" / "checkpoint-4" / "COMMITTED")
