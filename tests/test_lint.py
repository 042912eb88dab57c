"""`ruff check` passes on the repository, with the rules of pyproject.toml's [tool.ruff]: an unused import, an
undefined name, an import block out of order or a line over 120 characters fails here, and a `# noqa` comment
is a checked exception rather than a note (one ruff cannot read, which it only warns of, fails too).

ruff is in the `dev` extra; it runs as `python -m ruff` from this interpreter's environment.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from tests.support import ROOT

while not os.path.isfile(os.path.join(ROOT, "pyproject.toml")) and os.path.dirname(ROOT) != ROOT:
    ROOT = os.path.dirname(ROOT)  # the tests may move into sub-folders: find the repository root


@pytest.fixture(autouse=True)
def no_leaked_process_group():
    """Replaces the suite's guard of the same name (tests/conftest.py): no process group here, and the guard's
    import of raytrainer (torch, Ray) would cost seconds."""
    yield


def test_ruff_check_passes():
    if importlib.util.find_spec("ruff") is None:
        pytest.fail('ruff is not installed: pip install -e ".[dev]" (the dev extra has it)')
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise",
                             "."], cwd=ROOT, capture_output=True, text=True, timeout=300)
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    assert result.returncode == 0 and not warnings, f"ruff check found problems:\n{result.stdout}{result.stderr}"
