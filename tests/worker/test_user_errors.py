"""A worker's error told as one line that names the fix (raytrainer/worker/user_errors.py)."""

from __future__ import annotations

from raytrainer.worker.user_errors import describe


def test_a_missing_module_on_a_worker_names_runtime_env_working_dir_and_pythonpath():
    try:
        try:
            import no_such_module_for_raytrainer  # noqa: F401
        except ModuleNotFoundError as exc:
            raise RuntimeError("Failed to unpickle the trainer") from exc  # as an unpickling layer wraps it
    except RuntimeError as wrapped:
        line = describe(wrapped, rank=1, kind="train")
    assert line.startswith("train() failed on worker rank 1: ")
    assert "RuntimeError: Failed to unpickle the trainer" in line
    assert "cannot import 'no_such_module_for_raytrainer'" in line
    assert "runtime_env" in line and "working_dir" in line and "PYTHONPATH" in line and "\n" not in line
