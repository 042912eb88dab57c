"""`ray.data.Dataset` input on real Ray: every row trained on exactly once per epoch on 2 workers (an odd
row count, so the shards are uneven), also after a worker is killed mid-epoch (and then with the weights
of the uninterrupted run: the split is deterministic), also when Ray cannot know the length; evaluation
(2 workers, during training and by evaluate() after it) and prediction (in process) in dataset order; bad
input refused on the driver."""

import collections
import os

import numpy as np
import pytest
import torch

from raytrainer import Trainer, TrainingArguments
from raytrainer.errors import ConfigError
from raytrainer.storage import join
from tests.models import VOCAB, assert_same_weights, make_model, weights
from tests.support import SESSION_CPUS, die_once_committed

pytestmark = pytest.mark.usefixtures("ray_session")
ROWS = 51  # odd: 26 + 25 rows on 2 workers, so one rank pads its last micro-batch
KILL_AT = 6


def tokenize(batch):
    """The preprocessing Ray Data runs in map_batches: a row id to a token sequence and its labels."""
    idx = batch["id"]
    ids = (idx[:, None] * 7 + np.arange(6)[None, :]) % VOCAB
    return {"idx": idx, "input_ids": ids, "labels": (ids + 1) % VOCAB}


def rows(count=ROWS, known_length=True):
    import ray

    ds = ray.data.range(count, override_num_blocks=5).map_batches(tokenize)
    return ds.materialize() if known_length else ds  # after map_batches Ray knows the length only once run


class CountsRows(Trainer):
    """Writes (attempt, step, epoch, row ids) of every trained micro-batch; rank 1 dies once at KILL_AT when
    `die` is set, after checkpoint-4 is committed."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # In a run only (not the driver's 2-sample check, which also runs with gradients), not on fillers.
        if getattr(self, "_loop", None) is not None and torch.is_grad_enabled() and self._loss_weight:
            # Decided once per worker process: a rank of the first group can still be training when rank 1
            # writes the marker and dies, and that step is rolled back with its group.
            if not hasattr(self, "_attempt"):
                self._attempt = 2 if os.path.exists(self.marker) else 1
            attempt = self._attempt
            ids = " ".join(str(int(i)) for i in inputs["idx"])
            with open(os.path.join(self.log_dir, f"rows.{os.getpid()}"), "a") as f:
                f.write(f"{attempt} {self.state.global_step + 1} {self.state.epoch_index} {ids}\n")
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def training_step(self, model, inputs, num_items_in_batch=None):
        if self.die and self.ctx.rank == 1 and self.state.global_step + 1 == KILL_AT and not os.path.exists(
                self.marker):
            die_once_committed(join(self.args.output_dir, "checkpoint-4"), self.marker)
        return super().training_step(model, inputs, num_items_in_batch)


def make_trainer(tmp_path, name, dataset, die=False, **overrides):
    log_dir = tmp_path / f"{name}-rows"
    log_dir.mkdir()
    kwargs = dict(output_dir=str(tmp_path / name), num_workers=2, per_device_train_batch_size=4,
                  num_train_epochs=2, save_steps=4, logging_steps=1, learning_rate=1e-2, disable_tqdm=True,
                  seed=5, max_failures=1)
    kwargs.update(overrides)
    trainer = CountsRows(model=make_model(), args=TrainingArguments(**kwargs), train_dataset=dataset)
    trainer.log_dir, trainer.marker, trainer.die = str(log_dir), str(tmp_path / f"{name}-killed"), die
    return trainer


def trained_rows(trainer, resumed_at=None):
    """{epoch: Counter(row id)} of the training that counts: a step the first attempt ran after the
    checkpoint it was resumed from was rolled back and run again."""
    per_epoch = collections.defaultdict(collections.Counter)
    for name in os.listdir(trainer.log_dir):
        for line in open(os.path.join(trainer.log_dir, name)):
            attempt, step, epoch, *ids = (int(x) for x in line.split())
            if attempt == 1 and resumed_at is not None and step > resumed_at:
                continue
            per_epoch[epoch].update(ids)
    return per_epoch


def test_every_row_once_per_epoch_and_exact_after_a_kill_mid_epoch(tmp_path):
    dataset = rows()
    reference = make_trainer(tmp_path, "ref", dataset)
    out = reference.train()
    counts = trained_rows(reference)
    assert sorted(counts) == [0, 1]
    for epoch in (0, 1):
        assert counts[epoch] == collections.Counter(range(ROWS)), f"epoch {epoch}"
    assert out.global_step == 2 * 7  # ceil(ceil(51 / 2) / 4) micro-batches per epoch, as a map-style dataset
    losses = [h["loss"] for h in reference.state.log_history if "loss" in h]
    assert losses[-1] < losses[0] * 0.9

    # A second run on the same dataset takes the same worker group: each job makes its own split.
    killed = make_trainer(tmp_path, "killed", dataset, die=True)
    killed.train()
    assert killed._group is reference._group
    assert os.path.exists(killed.marker), "the injected failure never happened"
    [restart] = killed.state.restarts
    assert restart["global_step"] == 4  # the newest committed checkpoint, mid-epoch 0 (7 steps)
    counts = trained_rows(killed, resumed_at=4)
    for epoch in (0, 1):
        assert counts[epoch] == collections.Counter(range(ROWS)), f"epoch {epoch}"
    # Same world size, deterministic split: the resumed run is the uninterrupted one.
    assert_same_weights(weights(killed.model), weights(reference.model))


def test_unknown_length_every_row_once_per_epoch_and_evaluation_in_order(tmp_path):
    with pytest.raises(ConfigError, match="set max_steps"):
        make_trainer(tmp_path, "no-max", rows(known_length=False)).train()

    expected = tokenize({"id": np.arange(9)})["labels"]  # an unmaterialized pipeline keeps the ids' order

    def compute_metrics(prediction):  # runs once, on rank 0, on the batches gathered from both ranks
        in_order = prediction.label_ids.shape == expected.shape and (prediction.label_ids == expected).all()
        return {"rows": float(len(prediction.label_ids)), "in_order": float(in_order)}

    trainer = make_trainer(tmp_path, "unknown", rows(known_length=False), max_steps=16, save_strategy="no",
                           eval_strategy="steps", eval_steps=16)
    trainer.eval_dataset = rows(9, known_length=False)
    trainer.compute_metrics = compute_metrics
    trainer.train()
    counts = trained_rows(trainer)
    finished = [e for e in counts if e + 1 in counts]  # epochs the 16 steps went past
    assert finished, f"16 steps never finished an epoch: {dict(counts)}"
    for epoch in finished:
        assert counts[epoch] == collections.Counter(range(ROWS)), f"epoch {epoch}"
    [evaluation] = [h for h in trainer.state.log_history if "eval_rows" in h]
    assert evaluation["eval_rows"] == 9 and evaluation["eval_in_order"] == 1.0
    # evaluate() after train() reads the same Ray eval set again, on the same worker group.
    group = trainer._group
    again = trainer.evaluate()
    assert again["eval_rows"] == 9 and again["eval_in_order"] == 1.0 and trainer._group is group


def test_in_process_and_bad_input(tmp_path):
    import ray

    trainer = make_trainer(tmp_path, "local", rows(), num_workers=0, num_train_epochs=1, save_strategy="no")
    trainer.train()
    assert trained_rows(trainer)[0] == collections.Counter(range(ROWS))

    # predict() on a Ray Dataset comes back in the dataset's order (on 2 workers the gathering is the
    # evaluation's, checked in order above).
    test_rows = rows(11)
    predicted = trainer.predict(test_rows)
    # The dataset's order: that of its materialized blocks (which finished first), not necessarily of ids.
    order = np.array([row["idx"] for row in test_rows.take_all()])
    batch = tokenize({"id": order})
    with torch.no_grad():
        expected = trainer.model(input_ids=torch.as_tensor(batch["input_ids"]))["logits"].numpy()
    np.testing.assert_allclose(predicted.predictions, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(predicted.label_ids, batch["labels"])

    unlabeled = ray.data.range(8).map_batches(lambda b: {"input_ids": (b["id"][:, None] + np.arange(4)) % VOCAB})
    with pytest.raises(ConfigError, match="no 'labels' column"):
        make_trainer(tmp_path, "nolabels", unlabeled, max_steps=2).train()

    # As many workers of 1 CPU (asked for) as the test Ray has CPUs leave none for Ray Data's tasks: refused
    # before any actor.
    with pytest.raises(ConfigError, match="leaves 0 for Ray Data's own tasks.*resources_per_worker"):
        make_trainer(tmp_path, "nocpu", rows(), num_workers=SESSION_CPUS, resources_per_worker={"CPU": 1}).train()
    # Workers that leave half a CPU (as on a brought cluster: the user's reservation is kept), and a map_batches at
    # its default of a whole CPU per task: it could never run beside them. Refused, naming the step and the fix.
    half_left = {"CPU": (SESSION_CPUS - 0.5) / 2}
    with pytest.raises(ConfigError, match=r"leaves 0.5 .* they ask 1 \(MapBatches\(tokenize\) asks 1 CPU per task\)"
                                          r".*resources_per_worker=\{'CPU': 2.5\}.*num_cpus"):
        make_trainer(tmp_path, "halfcpu", rows(known_length=False), max_steps=2,
                     resources_per_worker=half_left).train()
    # The same workers with a materialized dataset: only raytrainer's padding runs, at a quarter of a CPU.
    from raytrainer.coordinator import cluster

    cluster.check_cpus_left_for_data(2, half_left, *cluster.data_cpu_asks([rows()]))


def test_on_a_ray_started_here_workers_that_would_hold_every_cpu_reserve_less_for_ray_data():
    """The laptop case (as many workers as cores, on the Ray this process started: here the test session's 6
    logical CPUs): each worker reserves less than a CPU, leaving Ray Data a whole one (what its tasks ask by
    default), and the run is no longer refused."""
    from raytrainer.coordinator import cluster

    assert SESSION_CPUS == 6
    args = TrainingArguments(output_dir="unused", num_workers=6)
    assert cluster.started_here()
    data_cpus, asks = cluster.data_cpu_asks([rows(known_length=False)])
    assert (data_cpus, asks) == (1.0, "MapBatches(tokenize) asks 1 CPU per task")
    cluster.leave_cpus_for_data(args, use_gpu=False, data_cpus=data_cpus)
    assert args.resources_per_worker == {"CPU": 0.83}  # (6 - 1) / 6, rounded down
    cluster.check_cpus_left_for_data(6, cluster.worker_resources(args, False), data_cpus, asks)  # no error now
    asked = TrainingArguments(output_dir="unused", num_workers=6, resources_per_worker={"CPU": 1})
    cluster.leave_cpus_for_data(asked, use_gpu=False, data_cpus=data_cpus)
    assert asked.resources_per_worker == {"CPU": 1}  # the user's own reservation is kept (and refused above)
