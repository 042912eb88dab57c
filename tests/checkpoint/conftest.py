"""Each storage test runs twice: on a local directory and on a real S3 API (moto on loopback)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from raytrainer import storage
from raytrainer.checkpoint import manifest


@dataclass
class Store:
    url: str  # the run directory (output_dir), not created yet
    options: dict | None

    def join(self, *parts: str) -> str:
        return storage.join(self.url, *parts)

    def write(self, relative: str, data: bytes) -> str:
        url = self.join(relative)
        storage.write_bytes(url, data, self.options)
        return url


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path) -> Store:
    if request.param == "local":
        return Store(str(tmp_path / "run"), None)
    bucket = request.getfixturevalue("s3_bucket")
    return Store(bucket + "/run", request.getfixturevalue("s3_server").storage_options)


def trainer_state(step: int, eval_loss: float | None = None, best: str | None = None) -> dict:
    """A minimal HF trainer_state.json: a training log every 5 steps, an evaluation at `step`."""
    history = [{"step": s, "epoch": s / 10, "loss": 2.0 - s / 100, "learning_rate": 1e-3}
               for s in range(5, step + 1, 5)]
    if eval_loss is not None:
        history.append({"step": step, "epoch": step / 10, "eval_loss": eval_loss, "eval_runtime": 0.1})
    return {"global_step": step, "best_model_checkpoint": best, "log_history": history}


@pytest.fixture
def make_checkpoint():
    """Write checkpoint-<step> under a store: a weights file and trainer_state.json, committed or not."""

    def make(store: Store, step: int, committed: bool = True, eval_loss: float | None = None,
             best: str | None = None) -> str:
        url = store.join(f"checkpoint-{step}")
        store.write(f"checkpoint-{step}/model.safetensors", bytes(100 + step))
        store.write(f"checkpoint-{step}/trainer_state.json",
                    json.dumps(trainer_state(step, eval_loss, best)).encode())
        if committed:
            manifest.commit(url, step, store.options)
        return url

    return make
