"""listing.py and retention.py: which checkpoints exist, which count, which are deleted."""

from __future__ import annotations

import pytest

from raytrainer import storage
from raytrainer.checkpoint import listing
from raytrainer.checkpoint.retention import keep_only_best, rotate


@pytest.fixture
def run(store, make_checkpoint):
    """checkpoint-5 (best) and -10 committed, -15 partial, plus entries that are not checkpoints."""
    make_checkpoint(store, 5, eval_loss=0.25)
    make_checkpoint(store, 10, eval_loss=0.5, best=store.join("checkpoint-5"))
    make_checkpoint(store, 15, committed=False)
    store.write("checkpoint-last/x", b"1")  # not checkpoint-<int>
    store.write("logs/events.jsonl", b"{}")
    store.write("checkpoint-20", b"a file, not a directory")
    return store


def _steps(infos):
    return [info.step for info in infos]


def test_list_marks_state_best_newest_and_reads_metrics(run):
    infos = listing.list_checkpoints(run.url, run.options)
    assert _steps(infos) == [5, 10, 15]
    assert [i.committed for i in infos] == [True, True, False]
    assert [i.url for i in infos] == [run.join(f"checkpoint-{s}") for s in (5, 10, 15)]
    assert [(i.best, i.newest) for i in infos] == [(True, False), (False, True), (False, False)]
    assert all(i.size_bytes > 100 for i in infos)
    assert infos[0].metrics == {"epoch": 0.5, "loss": 1.95, "learning_rate": 1e-3, "eval_loss": 0.25,
                                "eval_runtime": 0.1}
    assert infos[2].metrics["loss"] == pytest.approx(1.85) and "eval_loss" not in infos[2].metrics


def test_absent_output_dir_lists_nothing(store):
    assert listing.list_checkpoints(store.join("never-written"), store.options) == []
    assert listing.newest_committed(store.join("never-written"), store.options) is None
    assert listing.remove_partial(store.join("never-written"), store.options) == []


def test_newest_committed_skips_partial_and_keeps_the_scheme(run):
    assert listing.newest_committed(run.url, run.options) == run.join("checkpoint-10")


def test_best_recorded_as_a_local_path_matches_by_name(store, make_checkpoint):
    make_checkpoint(store, 1)
    make_checkpoint(store, 2, best="/elsewhere/old-mount/checkpoint-1/")
    assert [i.best for i in listing.list_checkpoints(store.url, store.options)] == [True, False]


def test_remove_partial(run):
    assert listing.remove_partial(run.url, run.options) == [run.join("checkpoint-15")]
    assert _steps(listing.list_checkpoints(run.url, run.options)) == [5, 10]
    assert storage.exists(run.join("checkpoint-last/x"), run.options)  # not ours to delete


def test_metrics_at_takes_the_eval_at_the_step_over_the_last_train_log():
    history = [{"step": 4, "loss": 3.0}, {"step": 5, "loss": 2.0, "learning_rate": 0.1},
               {"step": 5, "eval_loss": 9.0}, {"step": 5, "eval_loss": 1.0},
               {"step": 6, "loss": 1.5}, {"step": 6, "train_runtime": 3.0}]
    assert listing.metrics_at({"log_history": history}, 5) == {"loss": 2.0, "learning_rate": 0.1,
                                                               "eval_loss": 1.0}
    assert listing.metrics_at({"log_history": history}, 7) == {"loss": 1.5}
    assert listing.metrics_at(None, 5) == {} and listing.metrics_at({"log_history": "x"}, 5) == {}


# ------------------------------------------------------------------------------------------- retention
@pytest.fixture
def five(store, make_checkpoint):
    """Committed checkpoint-1..5 (trainer_state says checkpoint-2 is best) and a partial checkpoint-6."""
    for step in range(1, 6):
        make_checkpoint(store, step, best=store.join("checkpoint-2"))
    make_checkpoint(store, 6, committed=False)
    return store


def _left(store):
    return [(i.step, i.committed) for i in listing.list_checkpoints(store.url, store.options)]


def test_rotate_keeps_newest_and_best_within_the_limit(five):
    deleted = rotate(five.url, 3, best_url=five.join("checkpoint-2"), storage_options=five.options)
    assert deleted == [five.join("checkpoint-1"), five.join("checkpoint-3")]
    assert _left(five) == [(2, True), (4, True), (5, True), (6, False)]  # the partial one is untouched


def test_rotate_limit_one_keeps_best_and_newest(five):
    rotate(five.url, 1, best_url="/local/path/checkpoint-2", storage_options=five.options)
    assert _left(five) == [(2, True), (5, True), (6, False)]


def test_rotate_reads_best_from_trainer_state_when_not_given(five):
    rotate(five.url, 2, storage_options=five.options)
    assert _left(five) == [(2, True), (5, True), (6, False)]


def test_rotate_keeps_what_a_run_started_afresh_committed_over_a_longer_earlier_runs_steps(store, make_checkpoint):
    """The same script run again in its output_dir: the earlier run left checkpoint-8; this one commits -2 (its
    best) and -4. Its newest is -4, committed last (transformers rotates by modification time), so the earlier
    run's -8 goes; by step -4 itself would be deleted and the run stop on finding it gone."""
    make_checkpoint(store, 8)
    make_checkpoint(store, 2)
    make_checkpoint(store, 4, best=store.join("checkpoint-2"))
    assert rotate(store.url, 1, best_url=store.join("checkpoint-2"), storage_options=store.options) == [
        store.join("checkpoint-8")]
    assert _left(store) == [(2, True), (4, True)]
    make_checkpoint(store, 6, best=store.join("checkpoint-2"))  # and on: now by commit time and by step alike
    assert rotate(store.url, 1, storage_options=store.options) == [store.join("checkpoint-4")]


def test_keep_only_best_deletes_every_committed_checkpoint_but_the_best(five):
    """transformers' end of training with save_total_limit=1: the best stays, the newest goes too; a partial one is
    not retention's; a best that is not here deletes nothing."""
    assert keep_only_best(five.url, five.join("checkpoint-9"), five.options) == []
    assert len(_left(five)) == 6
    assert keep_only_best(five.url, "/staging/checkpoint-2", five.options) == [
        five.join(f"checkpoint-{step}") for step in (1, 3, 4, 5)]
    assert _left(five) == [(2, True), (6, False)]


def test_rotate_without_limit_or_below_it_deletes_nothing(five):
    assert rotate(five.url, None, storage_options=five.options) == []
    assert rotate(five.url, 5, storage_options=five.options) == []
    assert len(_left(five)) == 6


def test_get_last_checkpoint_works_on_any_url_and_skips_unfinished_writes(store, make_checkpoint):
    """transformers' get_last_checkpoint sees nothing on s3:// and returns a partial checkpoint after a crash."""
    import raytrainer

    assert raytrainer.get_last_checkpoint(store.url, store.options) is None
    make_checkpoint(store, 5)
    make_checkpoint(store, 10, committed=False)
    assert raytrainer.get_last_checkpoint(store.url, store.options) == store.join("checkpoint-5")
