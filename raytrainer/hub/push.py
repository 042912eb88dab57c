"""`push_to_hub`: the saved model, and committed checkpoints, to the Hugging Face Hub, from the driver.

transformers' names and behaviour (`push_to_hub()`, `init_hf_repo()`, `args.hub_strategy`): workers never talk
to the Hub. What is pushed is what the run has committed: `save_model()`'s output_dir (`push_to_hub()`, and
`save_model()` itself when `args.push_to_hub`), and, with hub_strategy every_save / checkpoint /
all_checkpoints, each checkpoint once its commit marker is written (the workers' `save` event). Files are read
through fsspec, so an `s3://` output_dir pushes too (copied to a local staging folder first).

With `args.push_to_hub`, `train()` creates (or finds) the repository before any worker starts: an unreachable
Hub, a missing token or a name the token cannot write fails there, not after the run.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import tempfile
from typing import Any, List, Optional

from .. import storage
from ..callbacks.base import TrainerCallback
from ..errors import ConfigError

logger = logging.getLogger("raytrainer")

# transformers' two patterns, and our own bookkeeping (the run's lease) that is not the model's.
IGNORE_PATTERNS = ["_*", "checkpoint-*", ".raytrainer*"]
# Files of a checkpoint that make the model (transformers' list): copied to the repository's root on each push.
MODEL_FILES = ("config.json", "generation_config.json", "pytorch_model.bin", "model.safetensors",
               "adapter_config.json", "adapter_model.bin", "adapter_model.safetensors")
INDEX_FILES = ("pytorch_model.bin.index.json", "model.safetensors.index.json")
# Trainer attributes that stay on the driver (futures of pushes in flight are not picklable).
DRIVER_ONLY = ("_hub_pushes",)


def hub_api():
    """HfApi for HF_ENDPOINT as it is now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import HfApi

    return HfApi(endpoint=os.environ.get("HF_ENDPOINT") or None)


def _ignored(name: str) -> bool:
    return any(fnmatch.fnmatch(name, pattern) for pattern in IGNORE_PATTERNS)


class _Staged:
    """A local folder holding `url`'s files (the folder itself when local; a copy of a remote one, without
    ignored top-level entries). Removed when the uploads that read it are done."""

    def __init__(self, url: str, opts: Optional[dict], skip_ignored: bool, only_model: bool = False):
        if storage.is_local(url):
            self.path, self._temp = storage.local_path(url), None
            return
        self._temp = tempfile.TemporaryDirectory(prefix="raytrainer-hub-")
        self.path = self._temp.name
        fs, root = storage.get_fs(url, opts)
        for entry in fs.ls(root, detail=False):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            if (skip_ignored and _ignored(name)) or (only_model and not _is_model_file(name)):
                continue
            fs.get(entry, os.path.join(self.path, name), recursive=True)

    def release_after(self, futures: List[Any]):
        if self._temp is None:
            return
        pending = [f for f in futures if hasattr(f, "add_done_callback")]
        if not pending:
            self._temp.cleanup()
            return
        left = {"n": len(pending)}

        def done(_):
            left["n"] -= 1
            if left["n"] == 0:
                self._temp.cleanup()

        for future in pending:
            future.add_done_callback(done)


class HubMixin:
    hub_model_id: Optional[str] = None  # the repository, once init_hf_repo() made or found it

    def init_hf_repo(self, token: Optional[str] = None, private: Optional[bool] = None) -> None:
        """Create the repository `args.hub_model_id` (default: output_dir's name), or find it."""
        if not self.is_world_process_zero():
            return
        args = self.args
        name = getattr(args, "hub_model_id", None) or os.path.basename(args.output_dir.rstrip("/"))
        token = token if token is not None else getattr(args, "hub_token", None)
        private = private if private is not None else getattr(args, "hub_private_repo", None)
        self.hub_model_id = hub_api().create_repo(name, token=token, private=private, exist_ok=True).repo_id

    def push_to_hub(self, commit_message: Optional[str] = "End of training", blocking: bool = True,
                    token: Optional[str] = None, revision: Optional[str] = None, private: Optional[bool] = None,
                    **kwargs):
        """Save the model into output_dir, write its model card, and upload output_dir (without checkpoints)
        to `hub_model_id`. kwargs go to create_model_card. Returns the commit, or a Future if not blocking."""
        self.callback_handler.handle({"kind": "push_begin"})
        args = self.args
        model_name = kwargs.pop("model_name", None)
        if model_name is None:
            hub_id = getattr(args, "hub_model_id", None)
            model_name = hub_id.split("/")[-1] if hub_id else os.path.basename(args.output_dir.rstrip("/"))
        token = token if token is not None else getattr(args, "hub_token", None)
        if self.hub_model_id is None:
            self.init_hf_repo(token=token, private=private)
        self.save_model(_internal_call=True)
        if getattr(self.model, "model_tags", None) is not None:  # as transformers: the model's own tags
            tags = kwargs.get("tags") or []
            tags = [tags] if isinstance(tags, str) else list(tags)
            kwargs["tags"] = tags + [t for t in self.model.model_tags if t not in tags]
        self.create_model_card(model_name=model_name, **kwargs)
        self._finish_current_push()
        staged = _Staged(args.output_dir, args.storage_options, skip_ignored=True)
        result = hub_api().upload_folder(
            repo_id=self.hub_model_id, folder_path=staged.path, commit_message=commit_message, token=token,
            run_as_future=not blocking, ignore_patterns=IGNORE_PATTERNS,
            revision=revision if revision is not None else getattr(args, "hub_revision", None))
        staged.release_after([result])
        return result

    def _push_from_checkpoint(self, checkpoint_url: str) -> None:
        """A committed checkpoint: its model files to the repository's root, and with hub_strategy checkpoint /
        all_checkpoints the whole checkpoint into last-checkpoint/ or checkpoint-N/. Asynchronous, as in
        transformers: a push still running makes this one skip, unless hub_always_push."""
        args = self.args
        strategy = getattr(args, "hub_strategy", "every_save")
        if not self.is_world_process_zero() or strategy == "end" or self.hub_model_id is None:
            return
        pushes = self.__dict__.setdefault("_hub_pushes", [])
        if pushes and not getattr(args, "hub_always_push", False) and not all(f.done() for f in pushes):
            return
        self.callback_handler.handle({"kind": "push_begin"})
        whole = strategy in ("checkpoint", "all_checkpoints")
        checkpoint = _Staged(checkpoint_url, args.storage_options, skip_ignored=False, only_model=not whole)
        model = tempfile.TemporaryDirectory(prefix="raytrainer-hub-")
        _copy_model_files(checkpoint.path, model.name)
        if self.processing_class is not None and hasattr(self.processing_class, "save_pretrained"):
            self.processing_class.save_pretrained(model.name)
        message = (f"Training in progress, step {self.state.global_step}" if args.save_strategy == "steps"
                   else f"Training in progress, epoch {int(self.state.epoch)}")
        api, token, revision = hub_api(), getattr(args, "hub_token", None), getattr(args, "hub_revision", None)
        jobs = [api.upload_folder(repo_id=self.hub_model_id, folder_path=model.name, commit_message=message,
                                  token=token, run_as_future=True, ignore_patterns=IGNORE_PATTERNS, revision=revision)]
        if whole:
            name = "last-checkpoint" if strategy == "checkpoint" else checkpoint_url.rstrip("/").rsplit("/", 1)[-1]
            jobs.append(api.upload_folder(repo_id=self.hub_model_id, folder_path=checkpoint.path, path_in_repo=name,
                                          commit_message=message + ", checkpoint", token=token, run_as_future=True,
                                          revision=revision))
        jobs[0].add_done_callback(lambda _: model.cleanup())
        checkpoint.release_after(jobs)
        self._hub_pushes = [f for f in pushes if not f.done()] + jobs

    def _finish_current_push(self) -> None:
        """Wait for the checkpoint pushes still running (their errors are logged, not raised: transformers')."""
        for future in self.__dict__.get("_hub_pushes", []):
            try:
                future.result()
            except Exception as exc:  # noqa: BLE001
                logger.warning("A checkpoint push to the Hub failed: %s: %s", type(exc).__name__, exc)
        self._hub_pushes = []


def _is_model_file(name: str) -> bool:
    """A file `_copy_model_files` may take (weight shards included): all a remote checkpoint needs to stage
    when only the model is pushed."""
    return name in MODEL_FILES or name in INDEX_FILES or fnmatch.fnmatch(name, "model-*.safetensors") or \
        fnmatch.fnmatch(name, "pytorch_model-*.bin")


def _copy_model_files(checkpoint: str, into: str):
    import json
    import shutil

    names = list(MODEL_FILES)
    for index in INDEX_FILES:
        path = os.path.join(checkpoint, index)
        if os.path.isfile(path):
            names.append(index)
            with open(path, encoding="utf-8") as f:
                names.extend(set(json.load(f)["weight_map"].values()))
    for name in names:
        if os.path.isfile(os.path.join(checkpoint, name)):
            shutil.copy(os.path.join(checkpoint, name), os.path.join(into, name))


class _PushCheckpoints(TrainerCallback):
    """On the driver: each committed checkpoint (the `save` event) goes to the Hub."""

    observes_only = True  # the workers never wait for it

    def __init__(self, trainer):
        self.trainer = trainer

    def on_save(self, args, state, control, checkpoint: Optional[str] = None, **kwargs):
        if checkpoint is not None:
            self.trainer._push_from_checkpoint(checkpoint)


class checkpoint_pushes:
    """Around a train() run with args.push_to_hub: checkpoints are pushed as they are committed."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.callback = None

    def __enter__(self):
        args = self.trainer.args
        if getattr(args, "push_to_hub", False) and getattr(args, "hub_strategy", "every_save") != "end":
            self.callback = _PushCheckpoints(self.trainer)
            self.trainer.add_callback(self.callback)
        return self

    def __exit__(self, *exc):
        if self.callback is not None:
            self.trainer.pop_callback(self.callback)
        return False


def check_reachable(trainer):
    """With args.push_to_hub: make or find the repository now, before any worker starts; fail with the fix."""
    args = trainer.args
    if not getattr(args, "push_to_hub", False) or trainer.hub_model_id is not None:
        return
    endpoint = hub_api().endpoint
    try:
        trainer.init_hf_repo()
    except Exception as exc:  # noqa: BLE001 (connection, authentication, permission: all end here)
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        name = getattr(args, "hub_model_id", None) or os.path.basename(args.output_dir.rstrip("/"))
        raise ConfigError(
            f"push_to_hub=True, but the Hub repository {name!r} could not be created or found at {endpoint} "
            f"({type(exc).__name__}: {first[:300]}). No worker was started. Check the network and HF_ENDPOINT, "
            "and that hub_token (or HF_TOKEN, or `hf auth login`) may write there; or set push_to_hub=False and "
            "call trainer.push_to_hub() after training.") from None
