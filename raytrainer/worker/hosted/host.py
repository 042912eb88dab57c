"""A hosted job on one rank: every `transformers.Trainer` built while it runs gets raytrainer's checkpoints,
resume and event relay, without a changed line in the user's code.

While the job runs, four methods of `transformers.Trainer` itself are wrapped (so every subclass, TRL's
included, gets them through its own `super()` calls; restored when the job ends):

- `__init__`: a remote output_dir (`s3://...`) becomes a local staging directory for HF to write into (the URL
  is kept on the arguments); the progress bars and reporting integrations leave the workers (the driver shows
  progress and runs the reporters, from the relayed events); the `Relay` callback is added.
- `train`: rank 0 claims the output_dir from the driver (`HostedClaim`: the driver takes its lease and
  chooses the checkpoint to resume from, hosting/hosted_handler.py); every rank gets the answer, each node fetches
  that checkpoint into its staging directory, and HF's own `train(resume_from_checkpoint=...)` continues;
  while it runs, a SIGTERM is the relay's to agree on a step for (stops.py);
- `save_model`: a URL, or the run's own output_dir, is written to staging and uploaded by the process that
  saves (HF's `should_save`);
- `_save_checkpoint`: a checkpoint of the same step that an earlier run committed is un-committed first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ...checkpoint import hf_dirs
from ...checkpoint.listing import checkpoint_name
from ...checkpoint.manifest import uncommit
from ...checkpoint.writer import set_aside_if_damaged
from ...errors import ConfigError
from ...protocol import GroupStart, HostedClaim, HostedOrder, RestartHistory
from ...storage import absolute_if_local, is_local, join, local_path
from ...storage.retry import Retry
from ...storage.upload import upload_dir
from .relay import Relay
from .stops import HostedStop

URL_ATTRIBUTE = "_raytrainer_output_url"  # set on a hosted Trainer's arguments: its output_dir as given


class Host:
    def __init__(self, order: HostedOrder, ctx, emitter, stops):
        self.order, self.ctx, self.emitter = order, ctx, emitter
        self.stops = stops  # the job's preemption / Ctrl-C handling (stops.py JobStops)
        self.trainers: List[Any] = []  # built during the job, in order: a Trainer's index is its place here
        self.runs: List[Dict[str, Any]] = []  # one record per train() that ended (HostedResult.runs)
        self.reporters: Dict[int, tuple] = {}  # id(trainer) -> the report_to names it had (they run on the driver)
        self.staged: Dict[str, str] = {}  # staging folder -> the URL it stands for
        self.resumed: Dict[int, Optional[str]] = {}  # id(trainer) -> the checkpoint URL its train() resumed from
        self.group_told = False  # rank 0 told the driver this group started (group_started: once per group)
        self.history: Optional[RestartHistory] = None  # its answer: None in the job's first group

    # ------------------------------------------------------------------ what the wrapped methods ask
    def url_of(self, trainer) -> str:
        return getattr(trainer.args, URL_ATTRIBUTE, None) or self.url_for(trainer.args.output_dir)

    def url_for(self, path: str) -> str:
        """The output URL a path stands for: a staging folder (or a path inside one) is its URL's; others as
        they are (absolute)."""
        path = absolute_if_local(str(path))
        for staging, url in self.staged.items():
            if path == staging or path.startswith(staging + os.sep):
                return url + path[len(staging):].replace(os.sep, "/")
        return path

    def written_by(self, trainer) -> dict:
        return {"trainer": _class_name(trainer), "index": self.trainers.index(trainer), "run": self.order.run_id}

    def stage(self, args):
        """Before HF's __init__ reads them: a remote output_dir is written into this node's staging folder."""
        if args is None:
            return
        if getattr(args, "enable_jit_checkpoint", False):
            # What it asks for, a save on SIGTERM, the job does at a step every rank agrees on (stops.py). HF's
            # own would set a SIGTERM handler from this thread (refused off the main thread: the Trainer could
            # not be built) and save on the one rank that got the signal.
            args.enable_jit_checkpoint = False
        if getattr(args, URL_ATTRIBUTE, None) is not None:
            return
        url = self.url_for(args.output_dir)  # a copy of staged arguments (dataclasses.replace) keeps its URL
        setattr(args, URL_ATTRIBUTE, url)
        if not is_local(url):
            args.output_dir = hf_dirs.staging_dir(url)
            self.staged[args.output_dir] = url

    def adopt(self, trainer):
        """After HF's __init__: progress and reporting go to the driver; the relay is added."""
        self.trainers.append(trainer)
        for callback in list(trainer.callback_handler.callbacks):
            if type(callback).__name__ in ("ProgressCallback", "PrinterCallback", "NotebookProgressCallback") or \
                    type(callback).__module__.startswith("transformers.integrations"):
                trainer.callback_handler.remove_callback(callback)
        self.reporters[id(trainer)] = tuple(getattr(trainer.args, "report_to", None) or ())
        trainer.add_callback(Relay(self, trainer))

    def reserve(self, trainer):
        """Rank 0, as a Trainer is built: its output_dir's lease, taken by the driver now (a refusal is raised
        here, before the script prepares data or trains). No collective: a script may build a Trainer on rank 0
        alone."""
        if not self.ctx.is_main:
            return
        reply = self.emitter.claim(self._claim_of(trainer, lease_only=True))
        if reply is not None and reply.error:
            raise ConfigError(reply.error)

    def _claim_of(self, trainer, **fields) -> HostedClaim:
        """This Trainer's claim of its output_dir: the URL, its class and its number among the job's Trainers."""
        return HostedClaim(output_dir=self.url_of(trainer), trainer=_class_name(trainer),
                           index=self.trainers.index(trainer) if trainer in self.trainers else -1, **fields)

    def claim(self, trainer, requested) -> Optional[str]:
        """Every rank, as train() begins: the local checkpoint HF resumes from (None: start), chosen by the
        driver for this Trainer's output_dir and fetched into this node's staging folder."""
        reply = None
        if self.ctx.is_main:
            reply = self.emitter.claim(self._claim_of(
                trainer, requested=requested if isinstance(requested, (str, bool)) else None,
                report_to=self.reporters.get(id(trainer), ())))
        reply = self.ctx.broadcast_object(reply)
        if reply is None:
            raise ConfigError("The driver did not answer this Trainer's claim of its output_dir: a hosted job "
                              "must be run by raytrainer.hosted(...) or `raytrainer launch`.")
        if reply.error:
            raise ConfigError(reply.error)
        self.resumed[id(trainer)] = reply.resume_from
        if reply.resume_from is None:
            return None
        if is_local(reply.resume_from):  # read in place (verified by the driver); a plain HF folder as given
            return local_path(reply.resume_from)
        if self.ctx.local_rank == 0:  # one download per node, every byte checked against the manifest
            for url in (reply.resume_from, *reply.also_fetch):  # the best checkpoint too: HF loads it at the end
                hf_dirs.fetch(url, self.order.storage_options)
        self.ctx.barrier()
        return hf_dirs.fetched_path(reply.resume_from)

    def restart_history(self, trainer) -> Tuple[Optional[RestartHistory], bool]:
        """Rank 0, as a Trainer's training begins: the job's restarts so far (None in its first worker group),
        and whether this is the group's first Trainer to ask. The first one tells the driver that this group
        started (`group_started`, once per group, as the own loop's rank 0 does), with its step and checkpoint."""
        if self.group_told:
            return self.history, False
        self.group_told = True
        self.history = self.emitter.group_started(GroupStart(
            world_size=self.ctx.world_size, global_step=trainer.state.global_step,
            checkpoint=self.resumed.get(id(trainer)),
            gradient_accumulation_steps=trainer.args.gradient_accumulation_steps, keeps_global_batch=False))
        return self.history, True

    def uncommit(self, trainer):
        """Before HF writes checkpoint-N: one that an earlier run committed under that name loses its manifest
        first (rank 0; every rank waits), so a crash midway leaves a partial checkpoint, never a committed one
        whose files changed. A damaged one (the run resumed from an older checkpoint) is set aside as
        `checkpoint-N.damaged` instead, as the own loop's writer does: the evidence is kept, not written over."""
        if self.ctx.is_main:
            url, options = join(self.url_of(trainer), checkpoint_name(trainer.state.global_step)), \
                self.order.storage_options
            if set_aside_if_damaged(url, options, Retry(storage_options=options)) is None:
                uncommit(url, options)
        self.ctx.barrier()

    def record(self, trainer, relay_checkpoint: Optional[str], stopped: Optional[str] = None):
        """`stopped`: "interrupt" or "preemption" when a stop ended this train() at a saved step."""
        state = trainer.state
        # The rest of the TrainerState for the driver's `trainer.state` (best_model_checkpoint, best_metric, epoch,
        # ...; log_history travels once, beside it), the best named by the output_dir's URL, not a staging folder.
        rest = {f.name: getattr(state, f.name) for f in dataclasses.fields(state) if f.name != "log_history"}
        if rest.get("best_model_checkpoint"):
            rest["best_model_checkpoint"] = self.url_for(rest["best_model_checkpoint"])
        self.runs.append({"trainer": _class_name(trainer), "index": self.trainers.index(trainer),
                          "output_dir": self.url_of(trainer), "global_step": state.global_step,
                          "checkpoint": relay_checkpoint, "log_history": list(state.log_history),
                          "state": json.dumps(rest), "stopped": stopped})


def _class_name(trainer) -> str:
    return f"{type(trainer).__module__}.{type(trainer).__qualname__}"


def _relay_of(trainer) -> Optional[Relay]:
    return next((c for c in trainer.callback_handler.callbacks if isinstance(c, Relay)), None)


@contextlib.contextmanager
def installed(host: Host) -> Iterator[Host]:
    """Wrap transformers.Trainer's __init__, train, save_model and _save_checkpoint for the job's duration."""
    import transformers

    base = transformers.Trainer
    originals = {name: base.__dict__[name] for name in ("__init__", "train", "save_model", "_save_checkpoint")}
    init, train, save_model = originals["__init__"], originals["train"], originals["save_model"]
    save_checkpoint = originals["_save_checkpoint"]

    def hosted_init(self, *args, **kwargs):
        host.stage(kwargs["args"] if "args" in kwargs else (args[1] if len(args) > 1 else None))
        init(self, *args, **kwargs)
        host.stage(self.args)  # HF built default arguments: nothing to stage, but the URL is recorded
        host.adopt(self)
        host.reserve(self)

    def hosted_train(self, resume_from_checkpoint=None, *args, **kwargs):
        resume = host.claim(self, resume_from_checkpoint)
        relay = _relay_of(self)
        try:
            with host.stops.training():  # a SIGTERM meanwhile is the relay's to agree on (stops.py)
                output = train(self, resume, *args, **kwargs)
        except HostedStop as stop:
            host.record(self, stop.checkpoint, stopped=stop.reason)
            raise
        host.record(self, relay.checkpoint if relay is not None else None)
        return output

    def hosted_save_model(self, output_dir: Optional[str] = None, _internal_call: bool = False):
        if _internal_call:  # a checkpoint's model, inside staging: committed with the checkpoint
            return save_model(self, output_dir, _internal_call=True)
        url = host.url_for(output_dir) if output_dir else host.url_of(self)  # its staging folder: its URL
        if is_local(url):
            return save_model(self, local_path(url))
        staging = hf_dirs.staging_dir(url)
        save_model(self, staging)
        if self.args.should_save:
            upload_dir(staging, url, host.order.storage_options)

    def hosted_save_checkpoint(self, model, trial, *args, **kwargs):
        host.uncommit(self)  # an older run's checkpoint of this step is not committed while HF overwrites it
        return save_checkpoint(self, model, trial, *args, **kwargs)

    base.__init__, base.train, base.save_model = hosted_init, hosted_train, hosted_save_model
    base._save_checkpoint = hosted_save_checkpoint
    try:
        yield host
    finally:
        for name, method in originals.items():
            setattr(base, name, method)
