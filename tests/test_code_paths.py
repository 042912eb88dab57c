"""Code the driver can import, the workers can import too (raytrainer/code_paths.py), without Ray: the modules the
driver imported from outside the interpreter's folders are found, zipped (sources only), and a process that
lacks their folder adds the driver's folders after its own and imports them from the extracted zip. On Ray
workers (a module made at run time, evaluate's dynamic modules): tests/integration/test_dynamic_modules.py."""

from __future__ import annotations

import importlib
import io
import sys
import tempfile
import zipfile

import pytest

from raytrainer import code_paths
from raytrainer.code_paths import DriverCode, driver_only_modules, install, pack


@pytest.fixture
def project(tmp_path, monkeypatch, request):
    """A package and a one-file module in a project folder of their own (names unique to the test)."""
    suffix = request.node.name[-24:].replace("[", "_").replace("]", "_")
    package, single = f"cp_pkg_{suffix}", f"cp_mod_{suffix}"
    folder = tmp_path / "project"
    (folder / package / "__pycache__").mkdir(parents=True)
    (folder / package / "__init__.py").write_text("from .inner import VALUE\n")
    (folder / package / "inner.py").write_text("VALUE = 42\n")
    (folder / package / "__pycache__" / "inner.cpython.pyc").write_bytes(b"stale")
    (folder / f"{single}.py").write_text("def double(x):\n    return 2 * x\n")
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where a worker extracts the zip
    (tmp_path / "tmp").mkdir()
    yield folder, package, single
    for name in list(sys.modules):
        if name.split(".")[0] in (package, single):
            del sys.modules[name]


def test_modules_from_outside_the_interpreter_are_the_driver_only_ones_and_zip_without_caches(project):
    folder, package, single = project
    sys.path.insert(0, str(folder))
    for name in (package, single):
        importlib.import_module(name)
    found = driver_only_modules()
    assert found[package] == str(folder / package) and found[single] == str(folder / f"{single}.py")
    assert "json" not in found and "torch" not in found and "raytrainer" not in found  # the interpreter's, ours
    archive = pack({package: found[package], single: found[single]})
    assert sorted(zipfile.ZipFile(io.BytesIO(archive)).namelist()) == sorted(
        [f"{package}/__init__.py", f"{package}/inner.py", f"{single}.py"])


def test_a_process_without_the_folder_imports_the_shipped_modules(project, tmp_path):
    folder, package, single = project
    archive = pack({package: str(folder / package), single: str(folder / f"{single}.py")})
    code = DriverCode(paths=(str(tmp_path / "gone"), str(tmp_path)), modules=(package, single), archive=archive,
                      digest="d1")
    own = list(sys.path)
    added = install(code)  # the driver's project folder is not on this node: the zip is extracted
    extracted = str(tmp_path / "tmp" / "raytrainer-code" / "d1")
    assert added == [str(tmp_path), extracted] and sys.path[:len(own)] == own  # after this process's own entries
    assert importlib.import_module(package).VALUE == 42 and importlib.import_module(single).double(4) == 8
    assert install(code) == []  # nothing new to add; the same digest is not extracted again


def test_folders_the_worker_sees_are_enough_and_a_stored_archive_is_fetched_only_when_needed(project, tmp_path):
    folder, package, _ = project
    fetched = []
    code = DriverCode(paths=(str(folder),), modules=(package,), archive="an ObjectRef", digest="d2")
    assert install(code, fetch=fetched.append) == [str(folder)] and fetched == []  # found at the driver's path
    assert importlib.import_module(package).VALUE == 42
    assert install(None) == [] and code_paths.capture(ship=False).archive is None
