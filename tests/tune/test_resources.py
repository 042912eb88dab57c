"""What a trial holds and how many run at once, from the arguments and the cluster's totals (no Ray)."""

import pytest

from raytrainer import TrainingArguments
from raytrainer.errors import ConfigError
from raytrainer.tune import resources
from raytrainer.tune.options import TRIAL_ACTOR


def args_of(tmp_path, **kw):
    return TrainingArguments(output_dir=str(tmp_path), use_gpu=False, **kw)


def test_a_trial_is_its_worker_group_and_its_actor(tmp_path):
    args = args_of(tmp_path, num_workers=2)
    assert resources.group_needs(args) == {"CPU": 2}
    assert resources.trial_needs(args, TRIAL_ACTOR) == {"CPU": 2, "memory": float(1 << 20)}
    assert resources.trial_needs(args, {"cpu": 1}) == {"CPU": 3}
    assert resources.ray_names({"cpu": 1, "gpu": 0, "custom": 2}) == {"CPU": 1.0, "GPU": 0.0, "custom": 2.0}


def test_the_trial_actor_asks_for_nothing_unless_it_trains(tmp_path):
    assert resources.trial_actor(args_of(tmp_path, num_workers=2), None) == TRIAL_ACTOR
    assert resources.trial_actor(args_of(tmp_path, num_workers=0), None) == {"cpu": 1}  # trains in the trial's actor
    assert resources.trial_actor(args_of(tmp_path, num_workers=0), {"cpu": 2}) == {"cpu": 2}
    assert resources.default_concurrency(args_of(tmp_path, num_workers=0), {"cpu": 1}, {"CPU": 2.0}) == 2


def test_an_elastic_trial_needs_its_minimum(tmp_path):
    assert resources.group_needs(args_of(tmp_path, num_workers=(1, 2))) == {"CPU": 1}


def test_concurrency_is_what_the_cluster_places(tmp_path):
    totals = {"CPU": 6.0, "memory": 8e9}
    assert resources.default_concurrency(args_of(tmp_path, num_workers=2), TRIAL_ACTOR, totals) == 3
    assert resources.default_concurrency(args_of(tmp_path, num_workers=1), TRIAL_ACTOR, totals) == 6
    assert resources.default_concurrency(args_of(tmp_path, num_workers=4), TRIAL_ACTOR, totals) == 1
    assert resources.default_concurrency(args_of(tmp_path, num_workers=2), {"cpu": 1}, totals) == 2


def test_a_trial_the_cluster_cannot_place_fails_before_any_starts(tmp_path):
    totals = {"CPU": 2.0, "memory": 8e9}
    with pytest.raises(ConfigError, match="needs 3 CPU.*has 2"):
        resources.check_trial_placeable(args_of(tmp_path, num_workers=3), TRIAL_ACTOR, totals)
    with pytest.raises(ConfigError, match="needs 3 CPU"):
        resources.check_trial_placeable(args_of(tmp_path, num_workers=2), {"cpu": 1}, totals)
    with pytest.raises(ConfigError, match="Leave GPUs out"):
        resources.check_trial_placeable(args_of(tmp_path, num_workers=1), {"cpu": 1, "gpu": 1}, totals)
    resources.check_trial_placeable(args_of(tmp_path, num_workers=2), TRIAL_ACTOR, totals)
