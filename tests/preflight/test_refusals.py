"""Bad input fails on the driver, before any actor starts, with an error that names the fix."""

import threading

import pytest
import torch

from raytrainer import ConfigError, StorageError, Trainer, TrainingArguments
from tests.models import NoLossModel, TokenData, make_model
from tests.support import SESSION_CPUS


def args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path / "out"), num_workers=0, max_steps=2, disable_tqdm=True)
    base.update(kw)
    return TrainingArguments(**base)


@pytest.mark.parametrize("field,value", [("learning_rate", "fast"), ("learning_rate", -1e-3),
                                         ("per_device_train_batch_size", 0), ("optim", "adamw_bnb"),
                                         ("lr_scheduler_type", "cosine_restarts")])
def test_bad_arguments_are_rejected_at_construction(tmp_path, field, value):
    with pytest.raises(ConfigError, match=field):
        args(tmp_path, **{field: value})


def test_dataset_without_the_label_column(tmp_path):
    trainer = Trainer(model=make_model(), args=args(tmp_path), train_dataset=TokenData(8, with_labels=False))
    with pytest.raises(ConfigError, match="train_dataset has no 'labels' column"):
        trainer.train()


def test_model_that_returns_no_loss_without_compute_loss_func(tmp_path):
    trainer = Trainer(model=NoLossModel(), args=args(tmp_path), train_dataset=TokenData(8))
    with pytest.raises(ConfigError, match="did not return a loss.*compute_loss_func"):
        trainer.train()


def test_compute_loss_func_makes_a_loss_free_model_trainable(tmp_path):
    def loss_func(outputs, labels, num_items_in_batch=None):
        return torch.nn.functional.cross_entropy(outputs["logits"].flatten(0, 1), labels.flatten(),
                                                 ignore_index=-100, reduction="sum") / num_items_in_batch

    trainer = Trainer(model=NoLossModel(), args=args(tmp_path, save_strategy="no"), train_dataset=TokenData(8),
                      compute_loss_func=loss_func)
    assert trainer.train().global_step == 2


def test_model_that_cannot_be_serialised_says_to_use_model_init(tmp_path):
    model = make_model()
    model.lock = threading.Lock()  # not picklable
    trainer = Trainer(model=model, args=args(tmp_path), train_dataset=TokenData(8))
    with pytest.raises(ConfigError, match="model cannot be serialised.*model_init"):
        trainer.train()


def test_no_model_at_all():
    with pytest.raises(ConfigError, match="model_init"):
        Trainer(args=TrainingArguments(disable_tqdm=True))


def test_read_only_output_dir_fails_before_training(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    trainer = Trainer(model=make_model(), args=args(tmp_path, output_dir=str(blocker / "run")),
                      train_dataset=TokenData(8))
    with pytest.raises(StorageError, match=str(blocker)):
        trainer.train()


def test_unreachable_s3_endpoint_and_missing_bucket(tmp_path, s3_server):
    opts = {"endpoint_url": "http://127.0.0.1:9", "key": "k", "secret": "topsecret"}
    trainer = Trainer(model=make_model(), args=args(tmp_path, output_dir="s3://bucket/run", storage_options=opts),
                      train_dataset=TokenData(8))
    with pytest.raises(StorageError) as err:
        trainer.train()
    assert "127.0.0.1:9" in str(err.value) and "topsecret" not in str(err.value)
    trainer.args.storage_options = s3_server.storage_options
    trainer.args.output_dir = "s3://no-such-bucket-here/run"
    with pytest.raises(StorageError, match="no-such-bucket-here"):
        trainer.train()


@pytest.mark.usefixtures("ray_session")
def test_more_workers_than_the_cluster_can_place_names_the_resource(tmp_path):
    import ray

    def alive_actors():  # read from the GCS directly: the state API needs the dashboard, which tests skip
        return sum(1 for a in ray._private.state.actors().values() if a["State"] == "ALIVE")

    before = alive_actors()
    trainer = Trainer(model=make_model(), args=args(tmp_path, num_workers=64), train_dataset=TokenData(8))
    with pytest.raises(ConfigError, match=rf"num_workers=64 needs 64 CPU .*cluster can place at most {SESSION_CPUS}"):
        trainer.train()
    gpu = Trainer(model=make_model(), args=args(tmp_path, num_workers=1, use_gpu=True), train_dataset=TokenData(8))
    with pytest.raises(ConfigError, match="1 GPU but no node of the cluster has that much"):
        gpu.train()
    assert alive_actors() == before, "an actor was started"
    assert ray.is_initialized()


@pytest.mark.usefixtures("ray_session")
def test_local_output_dir_on_a_multi_node_cluster_is_refused(tmp_path, monkeypatch):
    from raytrainer.coordinator import cluster

    monkeypatch.setattr(cluster, "alive_node_count", lambda: 2)
    trainer = Trainer(model=make_model(), args=args(tmp_path, num_workers=1), train_dataset=TokenData(8))
    with pytest.raises(StorageError, match="shared storage"):
        trainer.train()


def test_wrong_model_type_unknown_train_argument_and_evaluate_without_data(tmp_path):
    with pytest.raises(ConfigError, match="model must be a torch.nn.Module"):
        Trainer(model="gpt2", args=args(tmp_path))
    trainer = Trainer(model=make_model(), args=args(tmp_path), train_dataset=TokenData(8))
    with pytest.raises(ConfigError, match=r"unexpected arguments \['trial'\]"):
        trainer.train(trial={"lr": 1})
    with pytest.raises(ConfigError, match="evaluate\\(\\) needs an eval dataset"):
        trainer.evaluate()


def test_metric_for_best_model_that_evaluation_does_not_produce(tmp_path):
    trainer = Trainer(model=make_model(), args=args(tmp_path, eval_strategy="steps", eval_steps=1,
                                                    save_steps=1, metric_for_best_model="accuracy"),
                      train_dataset=TokenData(8), eval_dataset=TokenData(3))
    with pytest.raises(KeyError, match="metric_for_best_model='accuracy' is not among the evaluation metrics"):
        trainer.train()


def test_resuming_a_checkpoint_of_another_model_says_so(tmp_path):
    Trainer(model=make_model(), args=args(tmp_path, save_steps=2), train_dataset=TokenData(16)).train()

    class Wider(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(32, 24)
            self.head = torch.nn.Linear(24, 32)

        def forward(self, input_ids, labels=None, attention_mask=None, idx=None):
            logits = self.head(self.emb(input_ids))
            return {"loss": torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(),
                                                              ignore_index=-100)}

    other = Trainer(model=Wider(), args=args(tmp_path), train_dataset=TokenData(16))
    with pytest.raises(RuntimeError, match="(?s)Checkpoint does not match the model \\(Wider\\).*size mismatch"):
        other.train(resume_from_checkpoint=True)
