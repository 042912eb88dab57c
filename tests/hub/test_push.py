"""`push_to_hub` (raytrainer/hub/push.py) against a Hub API served on loopback by the test: committed checkpoints
and the saved model are pushed; an unreachable Hub fails before any worker starts."""

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from raytrainer import Trainer, TrainingArguments
from raytrainer.errors import ConfigError
from tests.models import TokenData, make_model
from tests.support import free_port


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
