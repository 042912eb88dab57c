"""transformers' **kwargs for Ray sorted into Tune's configs, without Ray running (Tune's classes only)."""

import pytest
from ray.tune import FailureConfig
from ray.tune.schedulers import ASHAScheduler, MedianStoppingRule, PopulationBasedTraining

from raytrainer import TrainingArguments
from raytrainer.errors import ConfigError
from raytrainer.tune.options import (
    DEFAULT_NAME,
    check_evaluates,
    check_synchronous_fits,
    exploits,
    saves_at_every_evaluation,
    split_kwargs,
)


def test_n_trials_is_num_samples_and_the_defaults():
    opts = split_kwargs({}, n_trials=6, direction="minimize")
    assert opts.tune_config == {"num_samples": 6, "reuse_actors": True, "metric": "objective", "mode": "min"}
    assert opts.run_config == {"name": DEFAULT_NAME}
    assert opts.resources == {} and opts.resume is None and opts.raise_on_failed_trial


def test_a_scheduler_without_metric_gets_the_objective_and_the_direction():
    scheduler = ASHAScheduler(max_t=4)
    opts = split_kwargs({"scheduler": scheduler, "max_concurrent_trials": 2}, 1, "maximize")
    assert opts.tune_config["scheduler"] is scheduler
    assert (opts.tune_config["metric"], opts.tune_config["mode"]) == ("objective", "max")
    assert opts.tune_config["max_concurrent_trials"] == 2


def test_a_scheduler_with_its_own_metric_keeps_it():
    """Tune refuses a metric in TuneConfig when the scheduler has one."""
    opts = split_kwargs({"scheduler": ASHAScheduler(metric="eval_loss", mode="min")}, 1, "minimize")
    assert "metric" not in opts.tune_config and "mode" not in opts.tune_config


def test_run_config_names_and_resources_go_where_tune_takes_them():
    stop = {"training_iteration": 3}
    opts = split_kwargs({"stop": stop, "name": "lr", "verbose": 0, "resources_per_trial": {"cpu": 1},
                         "reuse_actors": False, "resume": "AUTO"}, 2, "minimize")
    assert opts.run_config == {"stop": stop, "name": "lr", "verbose": 0}
    assert opts.resources == {"cpu": 1} and opts.tune_config["reuse_actors"] is False and opts.resume == "AUTO"


def test_max_failures_becomes_a_failure_config():
    opts = split_kwargs({"max_failures": 2}, 1, "minimize")
    config = opts.run_config["failure_config"]
    assert isinstance(config, FailureConfig) and (config.max_failures, config.fail_fast) == (2, False)
    with pytest.raises(ConfigError, match="either failure_config"):
        split_kwargs({"max_failures": 2, "failure_config": FailureConfig()}, 1, "minimize")


@pytest.mark.parametrize("name, fix", [("config", "hp_space"), ("num_samples", "n_trials"),
                                       ("keep_checkpoints_num", "save_total_limit"),
                                       ("checkpoint_at_end", "save_strategy"), ("local_dir", "output_dir")])
def test_kwargs_that_mean_nothing_here_name_what_to_use(name, fix):
    with pytest.raises(ConfigError, match=fix):
        split_kwargs({name: 1}, 1, "minimize")


def test_an_unknown_kwarg_is_refused_naming_the_known_ones():
    with pytest.raises(ConfigError, match="does not take \\['n_jobs'\\].*scheduler"):
        split_kwargs({"n_jobs": 2}, 1, "minimize")


def test_a_scheduler_that_decides_on_evaluations_needs_evaluations(tmp_path):
    no_eval = TrainingArguments(output_dir=str(tmp_path), num_workers=1, use_gpu=False)
    with pytest.raises(ConfigError, match="eval_strategy='steps'"):
        check_evaluates(no_eval, ASHAScheduler())
    with pytest.raises(ConfigError, match="MedianStoppingRule"):
        check_evaluates(no_eval, MedianStoppingRule())
    check_evaluates(no_eval, None)  # no scheduler: the trial evaluates once at its end
    evaluating = TrainingArguments(output_dir=str(tmp_path), num_workers=1, use_gpu=False, eval_strategy="steps",
                                   eval_steps=2)
    check_evaluates(evaluating, ASHAScheduler())

    # Population Based Training continues the checkpoint of the step a trial evaluated: every evaluation saves.
    pbt = PopulationBasedTraining(hyperparam_mutations={"learning_rate": [1e-3, 1e-2]})
    assert exploits(pbt) and not exploits(ASHAScheduler())
    with pytest.raises(ConfigError, match="every evaluation step must be a save step.*save_steps=500"):
        check_evaluates(evaluating, pbt)

    def aligned(**kw):
        return saves_at_every_evaluation(TrainingArguments(output_dir=str(tmp_path), num_workers=1, use_gpu=False,
                                                           **kw))

    assert aligned(eval_strategy="steps", eval_steps=4, save_steps=2)
    assert not aligned(eval_strategy="steps", eval_steps=3, save_steps=2)
    assert aligned(eval_strategy="steps", logging_steps=6, save_steps=3)  # eval_steps unset: logging_steps
    assert aligned(eval_strategy="epoch", save_strategy="epoch")
    assert not aligned(eval_strategy="epoch", save_strategy="steps")
    assert not aligned(eval_strategy="steps", eval_steps=2, save_strategy="no")
    check_evaluates(TrainingArguments(output_dir=str(tmp_path), num_workers=1, use_gpu=False, eval_strategy="steps",
                                      eval_steps=2, save_steps=2), pbt)


def test_synchronous_pbt_with_more_trials_than_run_at_once_is_refused():
    """Tune counts a paused trial as unfinished: the trials past max_concurrent_trials would never start, and
    synchronous PBT would wait for them forever."""
    synch = PopulationBasedTraining(synch=True, hyperparam_mutations={"learning_rate": [1e-3, 1e-2]})
    grid = {"learning_rate": {"grid_search": [1e-3, 1e-2, 1e-1]}, "seed": 3}
    with pytest.raises(ConfigError, match="sweep's 6 trials would wait forever.*<= 4.*max_concurrent_trials=6"):
        check_synchronous_fits(synch, grid, n_trials=2, concurrent=4)
    check_synchronous_fits(synch, grid, n_trials=1, concurrent=4)  # 3 trials, all at once
    asynchronous = PopulationBasedTraining(hyperparam_mutations={"learning_rate": [1e-3, 1e-2]})
    check_synchronous_fits(asynchronous, grid, n_trials=2, concurrent=4)
    check_synchronous_fits(ASHAScheduler(), grid, n_trials=2, concurrent=4)
