"""The driver's callbacks of a hosted run (raytrainer/hosting/callbacks.py): progress and the reporters the options
name, a fresh state mirror at each Trainer's train_begin, and what the callbacks get as `args` (the trainer's own
arguments, raytrainer's options given beside it or missing there, output_dir set at a claim)."""

from __future__ import annotations

import types

from raytrainer.callbacks.progress import PrinterCallback, ProgressCallback
from raytrainer.hosting.callbacks import HostedCallbackHandler, callback_args, driver_callbacks
from raytrainer.hosting.options import hosted_options


def test_each_trainers_train_begin_starts_a_fresh_state_mirror():
    handler = driver_callbacks(hosted_options({"disable_tqdm": True}, "here"))
    assert isinstance(handler, HostedCallbackHandler)
    assert [type(c) for c in handler.callbacks] == [PrinterCallback]
    handler.handle({"kind": "train_begin", "global_step": 0})
    handler.handle({"kind": "step_end", "global_step": 4})
    first = handler.state
    assert first.global_step == 4
    handler.handle({"kind": "train_begin", "global_step": 0})  # the script's next Trainer (DPO after SFT)
    assert handler.state is not first and handler.state.global_step == 0


def test_progress_and_reporters_then_the_users_callbacks():
    marker = object()
    handler = driver_callbacks(hosted_options({}, "here"), callbacks=[marker])
    assert isinstance(handler.callbacks[0], ProgressCallback) and handler.callbacks[-1] is marker


def test_the_callbacks_args_read_the_trainers_own_then_the_options():
    options = hosted_options({"run_name": "beside", "logging_dir": "/logs"}, "here")
    own = types.SimpleNamespace(output_dir="/out", run_name="own", learning_rate=1e-3)
    args = callback_args(own, options, given=frozenset({"run_name"}))
    assert (args.run_name, args.learning_rate, args.output_dir) == ("beside", 1e-3, "/out")  # given beside: wins
    assert args.logging_dir == "/logs" and args.storage_options is None  # the trainer's arguments lack them
    args.output_dir = "s3://bucket/claimed"  # a claim sets it here: the user's object is not changed
    assert args.output_dir == "s3://bucket/claimed" and own.output_dir == "/out"


def test_a_scripts_callbacks_read_the_options_and_the_claimed_output_dir():
    options = hosted_options({"storage_options": {"key": "secret"}}, "here")
    args = callback_args(None, options)
    assert args.output_dir is None  # until the first Trainer claims one
    args.output_dir = "/claimed"
    assert args.output_dir == "/claimed" and args.storage_options == {"key": "secret"}
    assert "secret" not in args.to_json_string()  # what TensorBoard and MLflow log of the run's arguments
