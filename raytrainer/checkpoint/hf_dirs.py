"""Checkpoints that Hugging Face's Trainer writes itself (the hosted mode, `worker/hosted/`), committed and read
back with raytrainer's guarantees.

HF writes `checkpoint-N/` into a local directory: rank 0 the model, optimizer, scheduler and trainer state,
every rank its own `rng_state_<rank>.pth` (and, sharded, its optimizer files). For an `output_dir` on local
disk it writes there and `commit` adds the manifest in place; for a URL (`s3://...`) it writes into a staging
directory on each node (`staging_dir`), and `commit` uploads each node's files, then writes the manifest. In
both cases the manifest (`COMMITTED`, with every file's size and checksum) is written by rank 0 last, after
every rank's files are in place: a checkpoint is never visible as committed before all of them are.

`fetch` is the way back: a committed checkpoint copied into the node's staging directory for HF's own resume,
every byte checked against the manifest as it is read.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from typing import Dict, Optional, Tuple

from ..storage import is_local, join, local_path
from ..storage.integrity import of_stream
from ..storage.retry import Retry
from ..storage.upload import download_file, local_files, upload_dir
from .damage import CheckpointDamagedError, verify
from .manifest import MANIFEST_NAME, commit as write_manifest, read_manifest

STAGING_ENV = "RAYTRAINER_STAGING_DIR"


def staging_dir(url: str) -> str:
    """This node's local directory for the remote `url` (one per URL: a restarted group finds its files)."""
    root = os.environ.get(STAGING_ENV) or os.path.join(tempfile.gettempdir(), "raytrainer-staging")
    return os.path.join(root, hashlib.sha1(url.encode()).hexdigest()[:16])


def node_files(local_dir: str, url: Optional[str], storage_options: Optional[dict]) -> Tuple[Dict[str, int],
                                                                                                 Dict[str, str]]:
    """What this node holds of a checkpoint written into `local_dir`: ({relative path: size}, {relative path:
    checksum}). With `url` (a remote output_dir) the files are uploaded there as they are read; without, they
    are read once for their checksums (a local output_dir: the files are already in place)."""
    if not os.path.isdir(local_dir):
        return {}, {}
    sizes = {name: os.path.getsize(os.path.join(local_dir, name)) for name in local_files(local_dir)}
    sizes.pop(MANIFEST_NAME, None)
    if url is not None:
        return sizes, upload_dir(local_dir, url, storage_options, Retry(storage_options=storage_options))
    checksums = {}
    for name in sizes:
        with open(os.path.join(local_dir, name), "rb") as f:
            checksums[name] = of_stream(f).hexdigest()
    return sizes, checksums


def commit(url: str, step: int, held: list, storage_options: Optional[dict], written_by: dict) -> dict:
    """Rank 0, once every node's `node_files` are in `held` (a list of their pairs): write the manifest last."""
    sizes: Dict[str, int] = {}
    checksums: Dict[str, str] = {}
    for node_sizes, node_checksums in held:
        sizes.update(node_sizes)
        checksums.update(node_checksums)
    return write_manifest(url, step, storage_options, files=sizes, checksums=checksums, written_by=written_by)


def fetch(url: str, storage_options: Optional[dict] = None) -> str:
    """A local directory holding the committed checkpoint `url`, every file checked against its manifest as
    it is read (a local checkpoint is read in place, after the same check). Raises `CheckpointDamagedError`."""
    manifest = read_manifest(url, storage_options)
    if manifest is None:
        raise CheckpointDamagedError(url, MANIFEST_NAME, "missing or unreadable")
    if is_local(url):
        damage = verify(url, storage_options, manifest)
        if damage is not None:
            raise damage
        return local_path(url)
    target = fetched_path(url)
    partial = target + ".fetching"
    shutil.rmtree(partial, ignore_errors=True)
    checksums = manifest.get("checksums") or {}
    for name, size in sorted(manifest["files"].items()):
        local = os.path.join(partial, name)
        os.makedirs(os.path.dirname(local), exist_ok=True)
        found = download_file(join(url, name), local, storage_options)
        if os.path.getsize(local) != size:
            raise CheckpointDamagedError(url, name, f"{os.path.getsize(local)} bytes, but {size} were committed")
        if name in checksums and checksums[name].split(":")[0] == found.split(":")[0] and checksums[name] != found:
            raise CheckpointDamagedError(url, name, f"its content changed since it was committed (checksum "
                                         f"{found}, committed {checksums[name]})")
    shutil.rmtree(target, ignore_errors=True)
    os.replace(partial, target)
    return target


def fetched_path(url: str) -> str:
    """Where `fetch` puts the remote checkpoint `url` on every node: inside its output_dir's staging folder,
    where HF's own layout has it."""
    return os.path.join(staging_dir(url.rstrip("/").rsplit("/", 1)[0]), os.path.basename(url.rstrip("/")))
