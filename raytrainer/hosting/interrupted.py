"""What the driver says when Ctrl-C ended a hosted job: every rank saved at one step and the job ended there
(worker/hosted/stops.py); the run is not finished, so the caller gets KeyboardInterrupt (`raytrainer launch`
exits with 130), after one line naming the checkpoint the same command resumes from."""

from __future__ import annotations

from ..callbacks.progress import ProgressCallback
from ..checkpoint.listing import checkpoint_name
from ..protocol import HostedResult


def stop_if_interrupted(result: HostedResult, again: str, handler) -> None:
    """Raise KeyboardInterrupt if a Trainer of the job was stopped by Ctrl-C; `again`: how to continue. The
    driver's progress bar (in `handler`, the driver's callbacks) is closed first: the job ended without its
    train's end."""
    stopped = [run for run in result.runs if run.get("stopped") == "interrupt"]
    if not stopped:
        return
    for callback in handler.callbacks:
        if isinstance(callback, ProgressCallback):
            callback.end()
    run = stopped[-1]
    if run["checkpoint"]:
        saved = f"saved {checkpoint_name(run['global_step'])} (in {run['output_dir']})"
        if not run["checkpoint"].endswith(checkpoint_name(run["global_step"])):  # HF saved none at that step
            saved = f"stopped at step {run['global_step']}; the newest checkpoint is {run['checkpoint']}"
    else:
        saved = f"stopped at step {run['global_step']} with no checkpoint saved (output_dir {run['output_dir']})"
    print(f"[raytrainer] interrupted: {saved}; {again}", flush=True)
    raise KeyboardInterrupt
