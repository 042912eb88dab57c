"""A Trainer keeps one Ray Train worker group between train(), evaluate() and predict() calls.

Which worker processes served a call is read from the user's own hooks (`compute_loss`, `prediction_step`
record os.getpid() in a file), so "the same group" means the same processes; results are compared with
the same calls in the driver process. How long the calls take is measured in benchmarks/worker_group.py.
"""

import logging
import os
import signal

import numpy as np
import pytest
import torch

from raytrainer import Trainer, TrainerCallback, TrainingArguments
from raytrainer.coordinator.pump import TrainingError
from raytrainer.errors import ConfigError
from tests.models import VOCAB, TokenData, assert_same_weights, make_model, weights
from tests.support import SESSION_CPUS, wait_for

pytestmark = pytest.mark.usefixtures("ray_session")

OURS = {"RayTrainWorker", "TrainController", "EventSink"}


class FixedLength(torch.utils.data.Dataset):
    """Equal-length rows without ignored labels: every batch has as many tokens, so an evaluation's loss (a
    mean of batch means, as in HF) does not depend on how the rows are grouped into batches and ranks."""

    def __init__(self, n: int, seed: int):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, VOCAB, (n, 6), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": (self.ids[i] + 1) % VOCAB}


class Recording(Trainer):
    """Records which process served each call; fails one evaluation when a flag file exists."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self._record("train")
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        self._record("eval")
        flag = os.path.join(self.args.output_dir, "fail-once")
        if os.path.exists(flag):
            os.remove(flag)
            raise ValueError("a user error in prediction_step")
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)

    def _record(self, kind):
        with open(os.path.join(self.args.output_dir, f"pids-{kind}"), "a") as f:
            f.write(f"{os.getpid()}\n")


def pids(trainer, kind) -> set:
    path = os.path.join(trainer.args.output_dir, f"pids-{kind}")
    with open(path) as f:
        found = set(f.read().split()) - {str(os.getpid())}  # the driver's preflight runs compute_loss once
    os.remove(path)
    return found


class StopAt(TrainerCallback):
    def __init__(self, step):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True


def our_actors() -> list:
    """The live actors of ours, from the GCS actor table: what `ray.util.state.list_actors` shows, without the
    dashboard it needs (the test Ray runs without one; benchmarks/worker_group.py checks through it)."""
    import ray._private.state

    return [a["ActorClassName"] for a in ray._private.state.actors().values()
            if a["State"] == "ALIVE" and a["ActorClassName"] in OURS]


def death_message(actor_id: str) -> str:
    """Why Ray says a dead actor died (its actor table's death cause)."""
    import ray._private.state

    return ray._private.state.actors(actor_id)["DeathCause"].actor_died_error_context.error_message


def wait_until_no_actor_of_ours(timeout_s: float = 30.0, among=our_actors) -> list:
    wait_for(lambda: not among(), timeout_s, every_s=0.5)
    return among()


class ActorsOf:
    """The actors of one group, named while it lives: its sink, its Ray Train controller and every worker that
    controller created (replacements too), so a test can check that none is left after close() while other
    groups of the pool live on."""

    def __init__(self, group):
        self.sink = group.sink._actor_id.hex()
        self.controller = group.controller()._actor_id.hex()

    def __call__(self) -> list:
        return [name for name in self.every_class() if name in OURS]

    def every_class(self) -> list:
        """The class of every live actor of the group, Ray Train's helpers too."""
        import ray._private.state

        table = ray._private.state.actors()
        address = table[self.controller]["Address"]
        owner = (address["IPAddress"], address["Port"])
        return [a["ActorClassName"] for actor_id, a in table.items()
                if a["State"] == "ALIVE" and (actor_id in (self.sink, self.controller)
                                              or (a["OwnerAddress"]["IPAddress"], a["OwnerAddress"]["Port"]) == owner)]


def options(tmp_path, **extra):
    base = dict(output_dir=str(tmp_path), num_workers=2, per_device_train_batch_size=4, per_device_eval_batch_size=4,
                max_steps=6, save_steps=3, learning_rate=1e-2, optim="adamw_torch", disable_tqdm=True, seed=3)
    return {**base, **extra}


def test_train_resume_evaluate_predict_run_on_one_group_and_equal_the_same_calls_in_process(tmp_path):
    args = TrainingArguments(**options(tmp_path / "group"))
    os.makedirs(args.output_dir)
    trainer = Recording(model=make_model(), args=args, train_dataset=TokenData(40),
                        eval_dataset=FixedLength(16, seed=1), callbacks=[StopAt(3)])
    assert trainer.train().global_step == 3
    trainer.pop_callback(StopAt)
    assert trainer.train(resume_from_checkpoint=True).global_step == 6
    train_pids = pids(trainer, "train")
    first = trainer.evaluate()
    prediction = trainer.predict(FixedLength(10, seed=2))
    again = trainer.evaluate()
    assert pids(trainer, "eval") == train_pids and len(train_pids) == 2  # every call on the same 2 processes
    # No DatasetManager: jobs split their own Ray Datasets, and one actor less is a faster group start (group.py).
    started = ActorsOf(trainer._group).every_class()
    assert started.count("RayTrainWorker") == 2 and "DatasetManager" not in started, started
    # Nor Ray Train's placement-group cleaner: a driver process removes an orphaned placement group itself.
    assert "PlacementGroupCleaner" not in started, started

    # One uninterrupted run (in process, the global batch of 8 as one batch) ends with the same weights.
    uninterrupted = Trainer(model=make_model(), args=TrainingArguments(**options(
        tmp_path / "whole", num_workers=0, per_device_train_batch_size=8)), train_dataset=TokenData(40))
    uninterrupted.train()
    assert_same_weights(weights(trainer.model), weights(uninterrupted.model))

    # The same calls in process, on the trained model.
    here = Trainer(model=trainer.model, args=TrainingArguments(**options(tmp_path / "here", num_workers=0)),
                   eval_dataset=FixedLength(16, seed=1))
    expected = here.evaluate()
    assert first["eval_loss"] == pytest.approx(expected["eval_loss"], rel=1e-5)
    assert again["eval_loss"] == pytest.approx(expected["eval_loss"], rel=1e-5)
    expected_prediction = here.predict(FixedLength(10, seed=2))
    np.testing.assert_allclose(prediction.predictions, expected_prediction.predictions, rtol=1e-5, atol=1e-6)
    assert prediction.metrics["test_loss"] == pytest.approx(expected_prediction.metrics["test_loss"], rel=1e-5)


def test_a_busy_group_refuses_the_next_call_and_the_idle_timeout(tmp_path, caplog):
    """The busy group is the pool's 2-worker one (its idle timeout must not end it while the second Trainer's
    preflight runs on a loaded machine). Its refusal releases every idle group first (their resources are what
    the second Trainer needs) and comes at once, since what the busy group holds cannot come back. It stays
    in the pool for later tests: the idle timeout is checked on 1-worker groups beside it."""
    busy = Trainer(model=make_model(), args=TrainingArguments(**options(tmp_path / "busy")),
                   eval_dataset=FixedLength(16, seed=1))
    expected = busy.evaluate()["eval_loss"]
    kept = ActorsOf(busy._group)
    # Only a group running a job holds its resources against another call: here, marked busy as a call in
    # another thread would be. The second Trainer is told who holds them and how to release them.
    second = Trainer(model=make_model(), args=TrainingArguments(**options(
        tmp_path / "b", resources_per_worker={"CPU": SESSION_CPUS // 2})), eval_dataset=FixedLength(4, seed=1))
    busy._group.busy = True
    try:
        with pytest.raises(ConfigError, match=r"while they run a job: the Trainer created at "
                                              r".*test_worker_group.py:\d+.*close\(\)"):
            second.evaluate()
    finally:
        busy._group.busy = False

    def others() -> list:  # our live actors but the kept group's
        left = our_actors()
        for name in kept():
            left.remove(name)
        return left

    args = TrainingArguments(**options(tmp_path / "a", num_workers=1, worker_idle_timeout_s=2))
    with Trainer(model=make_model(), args=args, eval_dataset=FixedLength(16, seed=1)) as trainer:
        assert trainer.evaluate()["eval_loss"] == pytest.approx(expected, rel=1e-6)
        released = ActorsOf(trainer._group).controller
        assert wait_until_no_actor_of_ours(among=others) == []  # released after 2 s without a call
        # Killed, not left to exit when its last handle went: Ray's graceful exit can hang (group.py).
        assert "killed by `ray.kill`" in death_message(released)
        args.worker_idle_timeout_s = 0  # 0: a group per call, released at its end
        with caplog.at_level(logging.WARNING, logger="raytrainer"):
            assert trainer.evaluate()["eval_loss"] == pytest.approx(expected, rel=1e-6)
        assert "Starting a new worker group for evaluate(): the previous one was released (close(), or " \
            "worker_idle_timeout_s" in caplog.text
        assert wait_until_no_actor_of_ours(among=others) == []
    assert trainer._group is None
    assert busy._group.alive and sorted(kept()) == ["EventSink", "RayTrainWorker", "RayTrainWorker",
                                                    "TrainController"]


def test_a_worker_killed_between_calls_and_a_user_error_leave_the_trainer_usable_and_close_leaves_no_actor(
        tmp_path):
    """On the pool's idle group where there is one (as a script's later Trainer): its actors are named, and
    close() must leave none of them, whatever other groups live on."""
    args = TrainingArguments(**options(tmp_path))
    trainer = Recording(model=make_model(), args=args, eval_dataset=FixedLength(16, seed=1))
    expected = trainer.evaluate()["eval_loss"]
    group = trainer._group
    actors = ActorsOf(group)
    assert sorted(actors()) == ["EventSink", "RayTrainWorker", "RayTrainWorker", "TrainController"]
    served = pids(trainer, "eval")
    os.kill(int(min(served)), signal.SIGKILL)
    assert trainer.evaluate()["eval_loss"] == pytest.approx(expected, rel=1e-6)  # on a replaced group
    # The survivor may have begun the job before Ray Train noticed the loss; two new processes finished it.
    replaced = pids(trainer, "eval")
    assert min(served) not in replaced and len(replaced - served) == 2 and trainer._group is group

    open(os.path.join(args.output_dir, "fail-once"), "w").close()
    with pytest.raises(TrainingError, match="ValueError: a user error in prediction_step"):
        trainer.evaluate()
    assert trainer.evaluate()["eval_loss"] == pytest.approx(expected, rel=1e-6)
    assert trainer._group is group  # Ray Train replaced the failed workers inside the same group

    # The controller killed without its own clean-up (as an out-of-memory kill would): its placement group, the
    # Ray job's, would hold both workers' CPUs until this driver exits. The driver removes it (group.py).
    placement = placement_group_state(group)
    assert placement() == "CREATED"
    import ray

    ray.kill(group.controller())
    group._thread.join(30)
    wait_for(lambda: placement() == "REMOVED", 10, every_s=0.2)
    assert placement() == "REMOVED"

    trainer.close()
    assert wait_until_no_actor_of_ours(among=actors) == []


def placement_group_state(group):
    """The state of the group's newest placement group, as Ray's table has it now."""
    import ray
    from ray._raylet import PlacementGroupID
    from ray.util.placement_group import PlacementGroup, placement_group_table

    hex_id = ray.get(group.sink.placement_group.remote())
    return lambda: placement_group_table(PlacementGroup(PlacementGroupID(bytes.fromhex(hex_id))))["state"]


def test_trainers_one_after_another_share_the_process_pool(tmp_path):
    """A script's shape: Trainer A trained and kept, B with FSDP, a bf16 C, A's run again: one worker group
    serves them all (no close()), and nothing of B's or C's jobs leaks into the next (A's rerun ends with A's
    weights). B resumed at 1 worker needs another shape: a group of its own (the pool's idle one where there
    is one). A's close() leaves the group `again` used last; the groups stay in the pool for the tests after
    (what close() leaves is checked by test_a_worker_killed_between_calls...)."""
    def make(name, **extra):
        return Trainer(model=make_model(), args=TrainingArguments(**options(tmp_path / name, **extra)),
                       train_dataset=TokenData(32))

    a = make("a")
    a.train()
    group = a._group
    b = make("b", strategy="fsdp")
    b.train()
    c = make("c", bf16=True)
    c.train()
    again = make("again")
    again.train()
    assert a._group is group and b._group is group and c._group is group and again._group is group
    assert_same_weights(weights(again.model), weights(a.model))

    b.args.num_workers, b.args.max_steps = 1, 8
    assert b.train(resume_from_checkpoint=True).global_step == 8
    # Another shape: another group. The idle one stays in the pool, since the other fits beside it.
    assert b._group is not group and group.alive
    a.close()  # `again` used the group last: A's close() leaves it alone
    assert group.alive and not group.closing


def test_bad_idle_timeout_is_refused():
    with pytest.raises(ConfigError, match="worker_idle_timeout_s=-1 must be >= 0"):
        TrainingArguments(worker_idle_timeout_s=-1)
