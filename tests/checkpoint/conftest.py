"""Checkpoint fixtures. Each test that takes `store` runs twice: on a local directory and on a real S3 API (moto
on loopback); the fixture is storage's (tests/storage/stores.py)."""

from __future__ import annotations

import json

import pytest

from raytrainer.checkpoint import manifest
from tests.storage.stores import Store, store  # noqa: F401  (fixture)


def trainer_state(step: int, eval_loss: float | None = None, best: str | None = None) -> dict:
    """A minimal HF trainer_state.json: a training log every 5 steps, an evaluation at `step`."""
    history = [{"step": s, "epoch": s / 10, "loss": 2.0 - s / 100, "learning_rate": 1e-3}
               for s in range(5, step + 1, 5)]
    if eval_loss is not None:
        history.append({"step": step, "epoch": step / 10, "eval_loss": eval_loss, "eval_runtime": 0.1})
    return {"global_step": step, "best_model_checkpoint": best, "log_history": history}


@pytest.fixture
def make_checkpoint():
    """Write checkpoint-<step> under a store (`run`): a weights file and trainer_state.json, committed or not."""

    def make(run: Store, step: int, committed: bool = True, eval_loss: float | None = None,
             best: str | None = None) -> str:
        url = run.join(f"checkpoint-{step}")
        run.write(f"checkpoint-{step}/model.safetensors", bytes(100 + step))
        run.write(f"checkpoint-{step}/trainer_state.json",
                  json.dumps(trainer_state(step, eval_loss, best)).encode())
        if committed:
            manifest.commit(url, step, run.options)
        return url

    return make
