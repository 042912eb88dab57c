"""Writing a checkpoint (raytrainer/checkpoint/writer.py): every committed file carries the checksum of its bytes,
and a damaged leftover of a step saved again is set aside, never deleted. Local disk and S3 (moto)."""

from __future__ import annotations

from raytrainer import storage
from raytrainer.checkpoint import listing, manifest
from raytrainer.checkpoint.damage import verify
from raytrainer.checkpoint.writer import clear_leftover
from raytrainer.storage.integrity import of_bytes
from raytrainer.storage.retry import Retry
from tests.checkpoint.test_integrity import _overwrite, _save


def test_every_committed_file_has_the_checksum_of_its_bytes(store):
    url = _save(store, 4)
    committed = manifest.read_manifest(url, store.options)
    assert committed["format"] == manifest.FORMAT
    assert set(committed["checksums"]) == set(committed["files"]) == {
        "model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state_0.pth", "trainer_state.json",
        "training_args.json"}
    for name, checksum in committed["checksums"].items():
        assert checksum == of_bytes(storage.read_bytes(storage.join(url, name), store.options)), name
    assert verify(url, store.options) is None


def test_a_damaged_leftover_is_set_aside_when_its_step_is_saved_again(store):
    url = _save(store, 8)
    _overwrite(store, url, "model.safetensors", -64, b"\x01" * 8)
    clear_leftover(url, store.options, Retry(storage_options=store.options))
    assert not storage.exists(url, store.options)
    aside = url + ".damaged"
    assert manifest.read_manifest(aside, store.options) is not None  # every file kept, under another name
    assert [s for s, _ in listing.checkpoint_dirs(store.url, store.options)] == []  # not a checkpoint-N any more
    _save(store, 8)  # the new one takes the step's name; an intact leftover is simply replaced
    _save(store, 8)
    assert verify(url, store.options) is None
