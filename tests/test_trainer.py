"""The Trainer methods transformers' documents teach to call or override: the subclassing guide's
`get_train_dataloader` recipe (`self._get_dataloader`, `self._train_batch_size`) with a `_get_train_sampler`
override on 2 workers, `is_world_process_zero` there and on the driver, a user error in an override as one
line, `get_eval_dataloader`/`get_test_dataloader`, `create_model_card` (local and S3), and `push_to_hub`
against a Hub API served on loopback by the test (an unreachable Hub fails before any worker starts)."""

import json
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
import yaml

from raytrainer import Trainer, TrainingArguments
from raytrainer.coordinator.pump import TrainingError
from raytrainer.data.user_sampler import draw
from raytrainer.errors import ConfigError
from raytrainer.storage import read_text
from raytrainer.worker_context import WorkerContext
from tests.models import TokenData, make_model
from tests.support import free_port

# Odd samples weigh nothing: a worker that trains on one did not use the override's sampler.
WEIGHTS = [1.0 if i % 2 == 0 else 0.0 for i in range(40)]


class RecipeTrainer(Trainer):
    fail_on_rank = None

    def get_train_dataloader(self):  # the subclassing guide's recipe, verbatim
        return self._get_dataloader(dataset=self.train_dataset, description="Training",
                                    batch_size=self._train_batch_size, sampler_fn=self._get_train_sampler,
                                    is_training=True)

    def _get_train_sampler(self, train_dataset=None):
        return torch.utils.data.WeightedRandomSampler(WEIGHTS, num_samples=24)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if model.training and self.ctx.world_size > 1:
            if self.fail_on_rank == self.ctx.rank:
                raise ValueError("labels out of range")
            with open(os.path.join(self.args.output_dir, f"rank{self.ctx.rank}"), "a") as f:
                f.write(json.dumps([inputs["idx"].tolist(), self.is_world_process_zero(),
                                    self.is_local_process_zero()]) + "\n")
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


def _seen(output_dir, rank):
    with open(os.path.join(output_dir, f"rank{rank}")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.usefixtures("ray_session")
def test_the_guides_dataloader_recipe_and_a_sampler_override_on_two_workers_and_an_error_in_one_line(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), num_workers=2, per_device_train_batch_size=4, max_steps=3,
                             save_strategy="no", disable_tqdm=True, learning_rate=1e-2)
    trainer = RecipeTrainer(model=make_model(), args=args, train_dataset=TokenData(40))
    assert trainer.is_world_process_zero() and trainer.is_local_process_zero()  # the driver
    trainer.train()

    # Every rank drew the override's order for the epoch and took its share of each global batch of 8.
    order = draw(torch.utils.data.WeightedRandomSampler(WEIGHTS, num_samples=24), args.train_data_seed, 0)
    for rank in (0, 1):
        seen = _seen(args.output_dir, rank)
        assert [batch for batch, _, _ in seen] == [order[8 * s + 4 * rank:8 * s + 4 * rank + 4] for s in range(3)]
        assert all(zero == (rank == 0) and local == (rank == 0) for _, zero, local in seen)

    trainer.fail_on_rank = 1
    started = time.time()
    with pytest.raises(TrainingError) as caught:
        trainer.train()
    message = str(caught.value)
    assert message.startswith("train() failed on worker rank 1: RecipeTrainer.compute_loss raised ValueError: "
                              "labels out of range (test_trainer.py:"), message
    assert "\n" not in message and len(message) < 200
    assert "Traceback" in caught.value.worker_traceback and "labels out of range" in caught.value.worker_traceback
    assert time.time() - started < 120


def test_eval_and_test_dataloaders_keep_transformers_semantics_and_shard_in_order(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), num_workers=0, per_device_eval_batch_size=2)
    trainer = Trainer(model=make_model(), args=args, eval_dataset={"a": TokenData(6), "b": TokenData(9, seed=1)})
    trainer.ctx = WorkerContext(rank=1, world_size=2)  # what rank 1 of 2 builds
    b = trainer.get_eval_dataloader("b")  # a str names one of the eval datasets
    assert [i for batch in b for i in batch["idx"].tolist()] == [4, 5, 6, 7, 8]  # the second contiguous half
    assert len(trainer.get_test_dataloader(TokenData(4)).dataset) == 2

    class Reversed(Trainer):
        def _get_eval_sampler(self, eval_dataset):
            return list(reversed(range(len(eval_dataset))))  # any iterable of indices, like a Sampler

    reverse = Reversed(model=make_model(), args=args)
    reverse.ctx = WorkerContext(rank=0, world_size=2)
    assert [i for batch in reverse.get_test_dataloader(TokenData(6)) for i in batch["idx"].tolist()] == [5, 4, 3]
    with pytest.raises(ValueError, match="evaluation requires an eval_dataset"):
        Trainer(model=make_model(), args=args).get_eval_dataloader()


def test_create_model_card_writes_transformers_card_through_fsspec(output_url):
    output_dir, options = output_url
    args = TrainingArguments(output_dir=output_dir, storage_options=options, num_workers=0, max_steps=2,
                             logging_steps=1, eval_strategy="steps", eval_steps=1, save_strategy="no",
                             disable_tqdm=True)
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(16), eval_dataset=TokenData(4))
    trainer.train()
    trainer.create_model_card(language="en", license="apache-2.0", tags="demo", finetuned_from="org/base",
                              tasks="text-generation", dataset="toy")
    trainer.create_model_card(model_name="tiny", tags=["more"])  # a second card keeps the first one's tags
    text = read_text(output_dir.rstrip("/") + "/README.md", options)
    metadata = yaml.safe_load(text.split("---")[1])
    assert metadata["tags"] == ["more", "generated_from_trainer", "demo"]
    assert metadata["model-index"][0]["name"] == "tiny"
    assert metadata["model-index"][0]["results"][0]["metrics"][0]["type"] == "loss"
    assert "# tiny" in text and "| Training Loss | Epoch | Step | Validation Loss |" in text
    assert "- total_train_batch_size" not in text and "- train_batch_size: 8" in text


class FakeHub(BaseHTTPRequestHandler):
    """The Hub API calls of create_repo and upload_folder (small files are sent inline in the commit)."""

    commits: list = []

    def _reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200 if body is not None else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._reply(None)

    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        here = f"http://127.0.0.1:{self.server.server_port}"
        if self.path == "/api/repos/create":
            name = json.loads(body)["name"]
            return self._reply({"url": f"{here}/user/{name}", "name": f"user/{name}"})
        if self.path == "/api/validate-yaml":
            return self._reply({})
        if "/preupload/" in self.path:
            return self._reply({"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                          for f in json.loads(body)["files"]]})
        if "/commit/" in self.path:
            lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
            FakeHub.commits.append((lines[0]["value"]["summary"],
                                    sorted(x["value"]["path"] for x in lines if x["key"] == "file")))
            return self._reply({"commitUrl": f"{here}/user/repo/commit/abc", "commitOid": "abc"})
        self._reply(None)

    def log_message(self, *args):
        pass


@pytest.fixture
def fake_hub(monkeypatch):
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setenv("HF_TOKEN", "hf_test")
    FakeHub.commits = []
    yield FakeHub.commits
    server.shutdown()


def test_push_to_hub_pushes_committed_checkpoints_and_the_saved_model(tmp_path, fake_hub):
    args = TrainingArguments(output_dir=str(tmp_path / "tiny-run"), num_workers=0, max_steps=4, save_steps=2,
                             disable_tqdm=True, hub_strategy="checkpoint", hub_always_push=True, push_to_hub=True)
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(32))
    trainer.train()
    assert trainer.hub_model_id == "user/tiny-run"  # made before training started
    trainer._finish_current_push()
    checkpoints = [c for c in fake_hub if c[0].startswith("Training in progress, step")]
    assert any("model.safetensors" in files for _, files in checkpoints)
    assert any(f.startswith("last-checkpoint/") for _, files in checkpoints for f in files)
    fake_hub.clear()
    trainer.save_model()  # with push_to_hub: saved, then pushed (transformers)
    (summary, files), = fake_hub
    assert summary == "Model save" and "README.md" in files and "model.safetensors" in files
    assert not any(f.startswith(("checkpoint-", ".raytrainer")) for f in files)


def test_an_unreachable_hub_fails_before_any_worker_starts(tmp_path, monkeypatch):
    port = free_port()  # nothing listens there
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    args = TrainingArguments(output_dir=str(tmp_path / "run"), num_workers=2, max_steps=2, disable_tqdm=True,
                             push_to_hub=True)
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(8))
    started = time.time()
    with pytest.raises(ConfigError, match=r"push_to_hub=True, but the Hub repository 'run' could not be created or "
                                          r"found at http://127\.0\.0\.1:\d+ .*No worker was started"):
        trainer.train()
    assert time.time() - started < 15 and trainer._group is None
