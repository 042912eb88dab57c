"""The driver's progress bar (raytrainer/callbacks/progress.py): what it shows of each log. The per-rank figures
that point at a straggler: tests/callbacks/test_events.py, on 2 workers."""

import types

from raytrainer.callbacks.progress import ProgressCallback


def test_progress_bar_shows_tokens_per_second():
    bar = ProgressCallback()
    bar.bar = types.SimpleNamespace(postfix=None, write=lambda line: None, n=0, update=lambda n: None,
                                    set_postfix=lambda postfix, refresh: setattr(bar.bar, "postfix", postfix))
    state = types.SimpleNamespace(global_step=0)
    bar.on_log(None, state, None, logs={"loss": 1.0, "train_tokens_per_second": 12345.6})
    assert bar.bar.postfix == {"loss": "1.0000", "tok/s": "1.235e+04"}
