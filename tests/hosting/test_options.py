"""The hosted mode's options (raytrainer/hosting/options.py): given beside the trainer or on `raytrainer launch`'s
command line, normalised and checked by the own loop's functions at its defaults, with no TrainingArguments built,
and turned into the coordinator's RunSpec."""

from __future__ import annotations

import inspect

import pytest

from raytrainer import TrainingArguments
from raytrainer.arguments import checks
from raytrainer.errors import ConfigError
from raytrainer.hosting.options import CHECKS, HOST_OPTIONS, HostedOptions, hosted_options, misplaced


def test_the_defaults_are_the_training_arguments_defaults(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path))
    options = hosted_options({}, "here")
    assert options == HostedOptions()
    for name in HOST_OPTIONS:
        if name == "logging_dir":
            assert options.logging_dir is None  # the reporters write under the output_dir a Trainer claims
        else:
            assert getattr(options, name) == (tuple(args.report_to) if name == "report_to" else getattr(args, name))
    assert options.resume is True


def test_values_are_brought_to_one_form():
    options = hosted_options({"num_workers": [1, 2], "storage_options": '{"endpoint_url": "http://x"}',
                              "report_to": "tensorboard", "logging_dir": "~/logs", "resume": False}, "here")
    assert options.num_workers == (1, 2) and options.max_workers == 2
    assert options.storage_options == {"endpoint_url": "http://x"}
    assert options.report_to == ("tensorboard",)
    assert not options.logging_dir.startswith("~") and options.resume is False


def test_an_elastic_range_is_not_held_to_the_own_loops_global_batch():
    """The own loop keeps its global batch at every size of a range (2-4 with 8 x 1 cannot be kept at 3 workers:
    refused); a hosted Trainer's batch is HF's, per device, so `raytrainer launch --num_workers 2-4` runs."""
    assert hosted_options({"num_workers": (2, 4)}, "raytrainer launch").num_workers == (2, 4)
    with pytest.raises(ConfigError, match="cannot be kept at 3 worker"):
        TrainingArguments(output_dir="unused", num_workers=(2, 4))


@pytest.mark.parametrize("given, match", [
    ({"num_workers": "two"}, "num_workers"),
    ({"worker_idle_timeout_s": -1}, "worker_idle_timeout_s"),
    ({"max_failures": -2}, "max_failures"),
    ({"resources_per_worker": {"GPU": 1}, "use_gpu": False}, "use_gpu=False"),
    ({"log_level": "loud"}, "log_level"),
    ({"callback_decisions": "later"}, "callback_decisions"),
    ({"ddp_timeout": 0}, "ddp_timeout"),
    ({"report_to": "nowhere"}, "nowhere"),
    ({"storage_options": "{not json"}, "storage_options"),
    ({"learning_rate": 1e-3}, "learning_rate, which is not an option of a hosted run"),
    ({"resume": "yes"}, "resume='yes'"),
])
def test_a_bad_option_is_refused_naming_it(given, match):
    with pytest.raises(ConfigError, match=match):
        hosted_options(given, "hosted(T, ...)")


def test_the_checks_are_those_of_the_topics_that_own_the_options():
    """Every topic of arguments/checks.py that owns a hosted option runs, but intervals_and_saving, whose only
    such option (run_name) it does not check (it reads output_dir, which a hosted run has not)."""
    owning = {check for check, fields in checks.TOPICS if set(fields) & set(HOST_OPTIONS)}
    assert owning - set(CHECKS) == {checks.intervals_and_saving}
    assert "run_name" not in inspect.getsource(checks.intervals_and_saving)


def test_the_run_spec_keeps_the_options():
    """(Ctrl-C saves at a step in a hosted run as in the own loop: tests/hosted/test_stops_on_ray.py.)"""
    options = hosted_options({"num_workers": 0, "max_failures": 2, "storage_options": {"k": "v"},
                              "log_level": "debug", "run_name": "sft"}, "here")
    spec = options.run_spec()
    assert spec.in_process
    assert (spec.max_failures, spec.storage_options, spec.run_name) == (2, {"k": "v"}, "sft")
    assert spec.ray_train_log_level == "DEBUG"


def test_the_options_as_the_reporters_log_them_hide_the_storage_secrets():
    options = hosted_options({"storage_options": {"secret": "s3cr3t"}}, "here")
    assert options.to_dict()["storage_options"] == {"secret": "<redacted>"}
    assert "s3cr3t" not in options.to_json_string()


def test_options_inside_the_trainer_arguments_are_named():
    assert misplaced(["num_workers", "learning_rate", "resume"]) == ["num_workers", "resume"]
