"""Hyperparameter search on Ray Tune (`Trainer.hyperparameter_search`): each trial a raytrainer run.

search.py    the sweep on the driver: checks, Tune's Tuner (or its restore), the best run
options.py   transformers' **kwargs for Ray sorted into TuneConfig, RunConfig and the trial's resources
resources.py what a trial holds (its actor, its worker group) and how many run at once
trial.py     the Tune trainable: one raytrainer run per trial, in output_dir/run-<trial id>
report.py    the driver-side callback that reports each evaluation to Tune and takes Tune's stop
optuna_search.py  backend="optuna": the study in the driver's process, each trial a run on the pool's warm group
hf_names.py  transformers' BestRun, default_hp_space_ray (default_compute_objective: report.py's copy)
"""
