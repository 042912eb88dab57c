"""Code the driver can import, the workers can import too.

Ray gives its workers the driver's script directory and working directory, as they were when Ray started.
What the driver reaches later is missing there: a folder the script put on `sys.path`, and the dynamic
modules of Hugging Face libraries (`evaluate.load("accuracy")` writes `evaluate_modules` into
HF_MODULES_CACHE and adds that folder to the driver's `sys.path`). A trainer whose compute_metrics or model
refers to such a module then failed to unpickle on the workers (`No module named 'evaluate_modules'`).

So each job carries the driver's import path (`capture`), and each worker adds the folders it lacks before
it unpickles the job (`install`), after its own entries, so a worker's installed packages still win. That
is enough where the workers see the driver's files (one node, or a shared file system). On a cluster of
several nodes the driver also ships the modules it imported from outside the interpreter's own folders (its
stdlib and site-packages) as one zip through the object store, up to `SHIP_LIMIT_BYTES`; a worker that cannot
find such a module at the driver's path extracts the zip once and imports from there.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import io
import logging
import os
import site
import sys
import sysconfig
import tempfile
import zipfile
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

logger = logging.getLogger("raytrainer")

# Beyond this (zipped), modules are not shipped: the warning says to use Ray's runtime_env instead.
SHIP_LIMIT_BYTES = 32 * 2**20
# Never shipped: raytrainer itself (the workers run it before they read a job) and the script run as __main__.
NOT_SHIPPED = frozenset({"raytrainer", "__main__", "__mp_main__"})


@dataclass(frozen=True)
class DriverCode:
    paths: Tuple[str, ...]  # the driver's sys.path folders, absolute, in its order
    modules: Tuple[str, ...] = ()  # top-level modules in `archive`
    archive: Any = None  # a zip of those modules: bytes, or an ObjectRef to them
    digest: str = ""  # of the archive: where a worker extracts it
    not_shipped: Tuple[str, ...] = field(default=())  # driver-only modules too large to ship


def hf_modules_cache() -> Optional[str]:
    """Where transformers and evaluate write dynamic modules (trust_remote_code, evaluate.load)."""
    path = os.environ.get("HF_MODULES_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "modules")
    return path if os.path.isdir(path) else None


def driver_paths() -> Tuple[str, ...]:
    paths = [os.path.abspath(p or os.curdir) for p in sys.path]
    cache = hf_modules_cache()
    if cache is not None:
        paths.append(cache)
    return tuple(p for p in dict.fromkeys(paths) if os.path.exists(p))


def interpreter_dirs() -> Tuple[str, ...]:
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, *sysconfig.get_paths().values()}
    try:
        dirs.update(site.getsitepackages())
        dirs.add(site.getusersitepackages())
    except AttributeError:
        pass
    return tuple(os.path.abspath(d) + os.sep for d in dirs if d)


def driver_only_modules() -> Dict[str, str]:
    """{top-level module: its file or package folder} for the modules the driver imported from outside the
    interpreter's own folders: what a worker on another node cannot be assumed to have."""
    interpreter = interpreter_dirs()
    found = {}
    for name, module in list(sys.modules.items()):
        if "." in name or name in NOT_SHIPPED or module is None:
            continue
        locations = list(getattr(module, "__path__", None) or [])  # a package: its folder(s)
        if not locations and getattr(module, "__file__", None):
            locations = [module.__file__]
        if len(locations) != 1 or not os.path.exists(locations[0]):  # built-in, frozen, namespace over several
            continue
        location = os.path.abspath(locations[0])
        if not location.startswith(interpreter):
            found[name] = location
    return found


def pack(modules: Dict[str, str]) -> bytes:
    """A zip whose top level holds each module (its .py file, or its package folder without caches)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, location in sorted(modules.items()):
            if os.path.isfile(location):
                archive.write(location, os.path.basename(location))
                continue
            for folder, dirs, files in os.walk(location):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__")
                for file in sorted(files):
                    if not file.endswith((".pyc", ".pyo")):
                        full = os.path.join(folder, file)
                        archive.write(full, os.path.join(name, os.path.relpath(full, location)))
    return buffer.getvalue()


def _size(location: str, limit: int) -> int:
    """Bytes under `location`, counting no further than `limit` (a large tree is not walked to its end)."""
    if os.path.isfile(location):
        return os.path.getsize(location)
    total = 0
    for folder, dirs, files in os.walk(location):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for file in files:
            total += os.path.getsize(os.path.join(folder, file))
            if total > limit:
                return total
    return total


def capture(ship: bool, put=None) -> DriverCode:
    """The driver's import path; with `ship` (a cluster of several nodes), its driver-only modules too.
    `put(bytes) -> ref` stores the archive (ray.put); without it the bytes travel in the job."""
    paths = driver_paths()
    if not ship:
        return DriverCode(paths)
    modules, left_out, budget = {}, [], SHIP_LIMIT_BYTES
    for name, location in sorted(driver_only_modules().items()):
        size = _size(location, budget)
        if size > budget:
            left_out.append(name)
        else:
            modules[name], budget = location, budget - size
    if left_out and set(left_out) - _warned:  # once per module, not once per job
        _warned.update(left_out)
        logger.warning("Not shipping %s to the workers (over %d MiB): workers on other nodes import them only if "
                       "installed there. Ship them with Ray: ray.init(runtime_env={'py_modules': [...]}).",
                       ", ".join(left_out), SHIP_LIMIT_BYTES // 2**20)
    if not modules:
        return DriverCode(paths, not_shipped=tuple(left_out))
    archive = _cached_pack(modules)
    digest = hashlib.sha256(archive).hexdigest()[:16]
    return DriverCode(paths, tuple(sorted(modules)), put(archive) if put else archive, digest, tuple(left_out))


_last: Dict[str, Any] = {}
_warned: set = set()


def _cached_pack(modules: Dict[str, str]) -> bytes:
    """The same modules, unchanged since the last job: the same zip (every job of a run asks)."""
    key = tuple(sorted((n, loc, _mtime(loc)) for n, loc in modules.items()))
    if _last.get("key") != key:
        _last.update(key=key, archive=pack(modules))
    return _last["archive"]


def _mtime(location: str) -> float:
    if os.path.isfile(location):
        return os.path.getmtime(location)
    return max((os.path.getmtime(os.path.join(f, n)) for f, _, names in os.walk(location) for n in names),
               default=0.0)


# ---------------------------------------------------------------- the worker's side
def install(code: Optional[DriverCode], fetch=None) -> List[str]:
    """Add the driver's folders this process lacks to sys.path (after its own), and the shipped modules it
    cannot find. `fetch(ref) -> bytes` reads a stored archive (ray.get). Returns the folders added."""
    if code is None:
        return []
    added = [p for p in code.paths if p not in sys.path and os.path.exists(p)]
    sys.path.extend(added)
    importlib.invalidate_caches()  # folders whose listing changed since this process last looked
    missing = [m for m in code.modules if m not in sys.modules and importlib.util.find_spec(m) is None]
    if missing and code.archive is not None:
        archive = code.archive if isinstance(code.archive, bytes) else fetch(code.archive)
        folder = _extract(archive, code.digest)
        if folder not in sys.path:
            sys.path.append(folder)
            added.append(folder)
        importlib.invalidate_caches()
    return added


def _extract(archive: bytes, digest: str) -> str:
    """Into a folder named by the archive's digest, once per node (a rename makes it appear whole)."""
    root = os.path.join(tempfile.gettempdir(), "raytrainer-code")
    folder = os.path.join(root, digest)
    if not os.path.isdir(folder):
        os.makedirs(root, exist_ok=True)
        staging = tempfile.mkdtemp(dir=root)
        with zipfile.ZipFile(io.BytesIO(archive)) as zipped:
            zipped.extractall(staging)
        try:
            os.rename(staging, folder)
        except OSError:  # another worker of this node got there first
            import shutil

            shutil.rmtree(staging, ignore_errors=True)
    return folder
