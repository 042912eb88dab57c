"""raytrainer's options of a hosted run: given beside the trainer (`hosted(SFTTrainer, num_workers=2)`,
`raytrainer launch --num_workers 2 script.py`), never inside its own arguments object.

They are the fields of raytrainer's `TrainingArguments` that concern the workers and the driver, not the
training itself (which the trainer's own arguments say), plus `resume`. `HostedOptions` holds them, normalised
and checked by the own loop's functions (arguments/normalise.py, the topics of arguments/checks.py that own
them), with the own loop's defaults; `run_spec` turns them into the coordinator's `RunSpec`. No
`TrainingArguments` is built: a hosted run has no output_dir of its own (each Trainer claims its own).
"""

from __future__ import annotations

import dataclasses
import json
import os
import types
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Tuple

from ..arguments.checks import devices_and_ddp, logging_and_evaluation, workers_and_ray
from ..arguments.normalise import json_objects
from ..arguments.report_to import normalise_report_to
from ..arguments.scaling import WorkerRange, Workers, bounds, normalise_workers
from ..arguments.training_args import TrainingArguments
from ..coordinator.spec import RunSpec, decide_use_gpu
from ..errors import ConfigError
from ..storage import absolute_if_local

HOST_OPTIONS = (
    "num_workers", "max_failures", "max_preemptions", "storage_options", "resources_per_worker", "use_gpu",
    "ray_address", "worker_idle_timeout_s", "elastic_resize_monitor_interval_s", "report_to", "logging_dir",
    "run_name", "disable_tqdm", "log_level", "log_level_replica", "ddp_timeout", "callback_decisions",
    "hang_warning_s", "hang_timeout_s",
)
# Ours only: a Trainer whose train() gets no resume_from_checkpoint continues from its newest checkpoint.
RESUME = "resume"
# The own loop's checks that own the options above (arguments/checks.py TOPICS; tests/hosting/test_options.py).
CHECKS = (workers_and_ray, logging_and_evaluation, devices_and_ddp)


@dataclass(frozen=True)
class HostedOptions(WorkerRange):
    """A hosted run's options (HOST_OPTIONS and `resume`); the defaults are `TrainingArguments`'. `logging_dir`
    None: the reporters write under the output_dir the first Trainer claims."""
    num_workers: Workers = 1
    max_failures: int = 0
    max_preemptions: int = -1
    storage_options: Optional[Dict[str, Any]] = None
    resources_per_worker: Optional[Dict[str, float]] = None
    use_gpu: Optional[bool] = None
    ray_address: Optional[str] = None
    worker_idle_timeout_s: float = 300.0
    elastic_resize_monitor_interval_s: float = 60.0
    report_to: Tuple[str, ...] = ()
    logging_dir: Optional[str] = None
    run_name: Optional[str] = None
    disable_tqdm: bool = False
    log_level: str = "passive"
    log_level_replica: str = "error"
    ddp_timeout: int = 1800
    callback_decisions: str = "same_step"
    hang_warning_s: float = 300.0
    hang_timeout_s: float = 1800.0
    resume: bool = True

    def run_spec(self) -> RunSpec:
        """The coordinator's spec of this run. With workers, after connecting to Ray (GPUs: the cluster's). In
        this process, the GPU is used where CUDA is, as the script would by itself (`decide_use_gpu`). Ctrl-C
        asks the ranks to save at a step and stop, as in the own loop (worker/hosted/stops.py)."""
        use_gpu = decide_use_gpu(self.use_gpu, self.max_workers, in_process_default=True)
        return RunSpec.of_arguments(self, use_gpu)

    def to_dict(self) -> dict:
        """The options as plain values, storage_options redacted (the reporters log them as the run's args)."""
        out = dataclasses.asdict(self)
        if out.get("storage_options"):
            out["storage_options"] = {k: "<redacted>" for k in out["storage_options"]}
        return out

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True, default=str)


def hosted_options(given: Mapping[str, Any], where: str) -> HostedOptions:
    """The options given `where` (named in errors), normalised and checked."""
    unknown = sorted(set(given) - set(HOST_OPTIONS) - {RESUME})
    if unknown:
        raise ConfigError(
            f"{where} got {', '.join(unknown)}, which is not an option of a hosted run. raytrainer's options are "
            f"{', '.join(HOST_OPTIONS + (RESUME,))}; the training's own settings go into the trainer's arguments "
            "object (SFTConfig(...), Seq2SeqTrainingArguments(...), ...).")
    values = dict(given)
    resume = values.pop(RESUME, True)
    if not isinstance(resume, bool):
        raise ConfigError(f"resume={resume!r}: True (continue from the newest checkpoint) or False (start fresh).")
    return HostedOptions(**_checked(values), resume=resume)


def _checked(values: Dict[str, Any]) -> Dict[str, Any]:
    """`values` in their one form, checked as `TrainingArguments` checks them: the checks read the other
    fields at their defaults."""
    view = types.SimpleNamespace(**_argument_defaults())
    for name, value in values.items():
        setattr(view, name, value)
    json_objects(view)
    view.report_to = tuple(normalise_report_to(view.report_to))
    if view.logging_dir is not None:
        view.logging_dir = absolute_if_local(os.path.expanduser(str(view.logging_dir)))
    view.num_workers = normalise_workers(view.num_workers)
    view.max_workers = bounds(view.num_workers)[1]
    for check in CHECKS:
        check(view)
    return {name: getattr(view, name) for name in HOST_OPTIONS}


def _argument_defaults() -> Dict[str, Any]:
    """Every `TrainingArguments` field at its declared default (read from the class; none is built), with the
    hosted run's own: no logging_dir until a Trainer claims its output_dir."""
    defaults = {}
    for f in dataclasses.fields(TrainingArguments):
        if f.default is not dataclasses.MISSING:
            defaults[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[f.name] = f.default_factory()
    defaults["logging_dir"] = None
    return defaults


def misplaced(names) -> list:
    """The names among `names` that are raytrainer's options (given inside the trainer's arguments)."""
    return sorted(set(names) & set(HOST_OPTIONS + (RESUME,)))
