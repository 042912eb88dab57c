"""`HostedHandler`: the driver's handler of a hosted job's claims (`coordinator/handlers.py` hands it each one).

As a hosted Trainer's train() begins, rank 0 sends a `HostedClaim` (after the events before it) and waits for
the `HostedClaimReply` (`protocol.py`). Here, before the reply:
- a local output_dir written from several nodes is refused (as in the own loop), the storage is probed
  (writable, readable, deletable) and the output_dir's one-writer lease taken for the job (kept over the
  job's restarts, released when it ends: checkpoint/lease.py);
- the checkpoint to resume from is chosen: the one the script named (checked against its manifest), or with
  resuming on (the default) the last committed, intact checkpoint that this same Trainer wrote (its class,
  recorded in the manifest, and where several Trainers of that class wrote the output_dir, its place among the
  script's Trainers), passing over damaged ones by name; a partial checkpoint (a write that never finished) is
  removed first, and said so (checkpoint/choice.py, the choice a resume and a restart make too).

The first claim also starts, on the driver, the reporters the script's arguments named (report_to), writing
under the claimed output_dir; the job's events go to the driver's callbacks (hosting/callbacks.py).
"""

from __future__ import annotations

import types
from typing import Any, Dict, Optional

from .. import storage
from ..callbacks.base import CallbackHandler
from ..callbacks.reporters import reporter_callbacks
from ..checkpoint import choice, lease
from ..checkpoint.damage import verify
from ..checkpoint.listing import read_trainer_state
from ..checkpoint.manifest import read_manifest
from ..coordinator import cluster
from ..errors import ConfigError, StorageError
from ..protocol import HostedClaim, HostedClaimReply
from ..storage import basename, join
from ..verbosity import notice


class HostedHandler:
    """Answers a hosted job's claims; holds the leases of the output_dirs claimed until the job ends (`close`).
    `callbacks`: the job's driver callbacks (the reporters a script names join them at its first claim)."""

    def __init__(self, callbacks: CallbackHandler, run_id: str, resume: bool, storage_options: Optional[dict],
                 reporters_named: bool):
        self.callbacks = callbacks
        self.run_id, self.resume, self.storage_options = run_id, resume, storage_options
        self.reporters_named = reporters_named  # report_to given beside the trainer: the script's is not used
        self.leases: Dict[str, Any] = {}
        self.claims: Dict[str, HostedClaim] = {}  # output_dir -> its last claim
        self.seen: set = set()  # (output_dir, trainer, index) claimed in this job: a second claim is a restart
        self.refused: Optional[str] = None  # why the last claim was refused (the job then fails on every rank)

    def close(self):
        """Release the job's leases (its output_dirs may be written by the next run)."""
        for held in self.leases.values():
            held.release()
        self.leases.clear()

    # ------------------------------------------------------------------ claims
    def answer_claim(self, claim: HostedClaim) -> HostedClaimReply:
        try:
            url = claim.output_dir
            if url not in self.leases:
                self.take(url)
            else:  # taken on the driver before Ray started (api.py, launch_script.py): Ray is up now
                self._check_nodes(url)
            if url not in self.claims:
                notice(f"{_short(claim.trainer)} writes its checkpoints to {url}")
            self.claims[url] = claim
            if claim.lease_only:  # the Trainer was built: its train() claims again, and is answered then
                return HostedClaimReply()
            self._start_reporters(claim)
            resume_from = self.choose_checkpoint(claim, restart=self._seen_before(claim))
            also = self.best_checkpoint_of(resume_from) if resume_from and not storage.is_local(resume_from) else ()
            return HostedClaimReply(resume_from=resume_from, also_fetch=also)
        except (ConfigError, StorageError) as exc:
            self.refused = str(exc)
            return HostedClaimReply(error=self.refused)

    def take(self, url: str):
        """The output_dir's storage probed and its one-writer lease taken for the job (raises ConfigError or
        StorageError). Taken on the driver before any worker starts where the driver knows the output_dir (the
        Python API's arguments, a launched script's `--output_dir`); at a Trainer's first claim otherwise."""
        self._check_nodes(url)
        storage.check_writable(url, self.storage_options)
        self.leases[url] = lease.acquire(url, self.run_id, self.storage_options)

    def _check_nodes(self, url: str):
        if storage.is_local(url) and _connected() and cluster.workers_may_be_elsewhere():
            raise StorageError(
                f"output_dir={url!r} is a local path, but the workers may run on {cluster.alive_node_count()} "
                "nodes: checkpoints written there could not be read back from the other nodes. Use shared "
                "storage (s3://..., or a path every node mounts).")

    def _start_reporters(self, claim: HostedClaim):
        """The first claim starts the reporters the script's arguments name (unless some were given beside the
        trainer), on the driver, writing under its output_dir."""
        args = self.callbacks.args
        args.output_dir = claim.output_dir
        if self.reporters_named or any(getattr(c, "_hosted_reporter", False) for c in self.callbacks.callbacks):
            return
        names = [n for n in claim.report_to if n not in ("none",)]
        if not names:
            return
        try:
            made = reporter_callbacks(types.SimpleNamespace(report_to=names))
        except (KeyError, ValueError):
            notice(f"report_to={names} of the script: not all are reporters raytrainer runs on the driver; "
                   "pass report_to beside the trainer to choose.")
            return
        for callback in made:
            callback._hosted_reporter = True
            self.callbacks.add(callback)

    def _seen_before(self, claim: HostedClaim) -> bool:
        """Whether this Trainer claimed its output_dir before in this job (then this claim is a restart's); the
        claim is recorded."""
        key = (claim.output_dir, claim.trainer, claim.index)
        seen = key in self.seen
        self.seen.add(key)
        return seen

    def choose_checkpoint(self, claim: HostedClaim, restart: bool = False) -> Optional[str]:
        """The checkpoint the Trainer resumes from (module docstring), or None to start. `restart`: a second
        claim of the same Trainer in this job (a lost worker): it continues from what this job committed, also
        when resuming is off (`--fresh` starts the job afresh, not each restart)."""
        url, requested = claim.output_dir, claim.requested
        if requested is False or (requested is None and not self.resume and not restart):
            return None
        if isinstance(requested, str):
            return choice.choose(url, self.storage_options, named=requested, hf_folders=True).url
        found = choice.choose(url, self.storage_options, trainer=claim.trainer, index=claim.index,
                              run_id=self.run_id if restart and not self.resume else None, by_commit_time=True,
                              remove_unfinished=True, doing=f"{_short(claim.trainer)} resumes")
        if found.url is not None:
            return found.url
        if found.damaged:
            notice(f"{_short(claim.trainer)} starts from step 0: every checkpoint it wrote under {url} is damaged; "
                   + found.passed_over())
        elif found.others_only:
            notice(f"{_short(claim.trainer)} starts from step 0: the checkpoints under {url} were written by "
                   f"another trainer ({', '.join(sorted(map(_short, found.others_only)))})")
        if requested is True:
            raise ConfigError(f"resume_from_checkpoint=True, but {url} holds no intact checkpoint of this "
                              f"{_short(claim.trainer)}.")
        return None

    def best_checkpoint_of(self, ckpt: str) -> tuple:
        """The best checkpoint that `ckpt`'s trainer state names, when another intact one (HF loads it at the end
        with load_best_model_at_end): fetched with it."""
        state = read_trainer_state(ckpt, self.storage_options) or {}
        best = state.get("best_model_checkpoint")
        if not best:
            return ()
        url = join(ckpt.rstrip("/").rsplit("/", 1)[0], basename(best))
        if url == ckpt or read_manifest(url, self.storage_options) is None:
            return ()
        return (url,) if verify(url, self.storage_options) is None else ()


def _connected() -> bool:
    import ray

    return ray.is_initialized()


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]
