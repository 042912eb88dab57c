"""The end-of-script helpers of Hugging Face example scripts (`log_metrics`, `save_metrics`, `save_state`),
so such a script ports by changing the import. They run on the driver and write through fsspec, so they
work with an S3 `output_dir` too.
"""

from __future__ import annotations

import datetime
import json

from .checkpoint.listing import TRAINER_STATE_NAME
from .storage import exists, join, read_text, write_text


def metrics_format(metrics: dict) -> dict:
    """The values as transformers' `metrics_format` shows them: runtimes as h:mm:ss.cc, memory in MB, FLOPs in
    GF, other floats to 4 decimals (a script's printed block reads the same under either Trainer)."""
    shown = {}
    for key, value in metrics.items():
        if "_mem_" in key and isinstance(value, int):
            shown[key] = f"{value >> 20}MB"
        elif "_runtime" in key and isinstance(value, (int, float)):
            centis = int(abs(value - int(value)) * 100)
            shown[key] = f"{datetime.timedelta(seconds=int(value))}.{centis:02d}"
        elif key == "total_flos" and isinstance(value, (int, float)):
            shown[key] = f"{int(value) >> 30}GF"
        elif isinstance(value, float):
            shown[key] = round(value, 4)
        else:
            shown[key] = value
    return shown


class MetricsFilesMixin:
    """The Trainer's log_metrics / save_metrics / save_state, gated on process zero as HF's are."""

    def is_world_process_zero(self) -> bool:
        """True on the driver and on rank 0 (on the workers the hooks run with their own rank)."""
        return self.ctx.rank == 0

    def is_local_process_zero(self) -> bool:
        return self.ctx.local_rank == 0

    def metrics_format(self, metrics: dict) -> dict:
        """transformers' method: the values as log_metrics shows them (module function `metrics_format`)."""
        return metrics_format(metrics)

    def log_metrics(self, split: str, metrics: dict):
        """Print `metrics` as an aligned block, e.g. `***** train metrics *****`."""
        if not self.is_world_process_zero():
            return
        print(f"***** {split} metrics *****")
        shown = metrics_format(metrics)
        key_width = max((len(key) for key in shown), default=0)
        value_width = max((len(str(value)) for value in shown.values()), default=0)
        for key in sorted(shown):
            print(f"  {key:<{key_width}} = {shown[key]:>{value_width}}")

    def save_metrics(self, split: str, metrics: dict, combined: bool = True):
        """Write `{split}_results.json` under output_dir, and merge it into `all_results.json`."""
        if not self.is_world_process_zero():
            return
        opts = self.args.storage_options
        write_text(join(self.args.output_dir, f"{split}_results.json"),
                   json.dumps(metrics, indent=4, sort_keys=True), opts)
        if combined:
            path = join(self.args.output_dir, "all_results.json")
            merged = json.loads(read_text(path, opts)) if exists(path, opts) else {}
            merged.update(metrics)
            write_text(path, json.dumps(merged, indent=4, sort_keys=True), opts)

    def save_state(self):
        """Write the trainer state (`trainer_state.json`, HF format) under output_dir."""
        if self.is_world_process_zero():
            write_text(join(self.args.output_dir, TRAINER_STATE_NAME), self.state.to_json_string(),
                       self.args.storage_options)
