"""Hyperparameter search: transformers' `Trainer.hyperparameter_search`, each trial a raytrainer run.

Shows: `model_init` (each trial builds its own model), a search space of Ray Tune's, an objective to maximize
from `compute_metrics`, and a scheduler that stops weak trials early (ASHA) or continues the best trials'
checkpoints with new values (Population Based Training). Each trial trains on its own worker group
(`num_workers`), with its checkpoints committed in `output_dir/run-<trial id>`; running the same command again
after the driver died takes the sweep up where it was. The task and data are sequence_classification.py's.

    python examples/hyperparameter_search.py                            # ASHA, 4 trials, 1 worker each
    python examples/hyperparameter_search.py --scheduler pbt            # Population Based Training
    python examples/hyperparameter_search.py --backend optuna --num_workers 0   # Optuna, in this process
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

from raytrainer import ArgumentParser, TrainingArguments

try:
    from examples.sequence_classification import DataArguments, accuracy, build_model, make_dataset
except ImportError:  # run as a script from the examples folder
    from sequence_classification import DataArguments, accuracy, build_model, make_dataset


@dataclass
class SearchArguments:
    n_trials: int = field(default=4, metadata={"help": "Trials (Ray Tune's num_samples; Optuna's n_trials)."})
    backend: str = field(default="ray", metadata={"help": "ray or optuna."})
    scheduler: str = field(default="asha", metadata={"help": "With backend=ray: asha, pbt or none."})


def ray_space(trial) -> dict:
    from ray import tune

    return {"learning_rate": tune.loguniform(1e-4, 1e-2), "weight_decay": tune.uniform(0.0, 0.1)}


def optuna_space(trial) -> dict:
    return {"learning_rate": trial.suggest_float("learning_rate", 1e-4, 1e-2, log=True),
            "weight_decay": trial.suggest_float("weight_decay", 0.0, 0.1)}


def make_scheduler(name: str, args: TrainingArguments):
    """ASHA stops a trial at an evaluation where it is behind; PBT (every evaluation saves: save_steps divides
    eval_steps) continues a better trial's checkpoint with perturbed values, and needs every trial running at
    once when synchronous."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining

    if name == "asha":
        return ASHAScheduler(time_attr="step", max_t=args.max_steps, grace_period=args.eval_steps)
    if name == "pbt":
        return PopulationBasedTraining(time_attr="step", perturbation_interval=args.eval_steps,
                                       hyperparam_mutations={"learning_rate": tune.loguniform(1e-4, 1e-2)})
    return None


def build_parser() -> ArgumentParser:
    parser = ArgumentParser([SearchArguments, DataArguments, TrainingArguments],
                            description=__doc__.splitlines()[0])
    parser.set_defaults(output_dir="runs/hyperparameter_search", num_workers=1, max_steps=120,
                        per_device_train_batch_size=32, per_device_eval_batch_size=64, logging_steps=20,
                        eval_strategy="steps", eval_steps=40, save_steps=40, lr_scheduler_type="constant",
                        disable_tqdm=True)
    return parser


def main(argv: list[str] | None = None):
    from raytrainer import Trainer

    search, data, args = build_parser().parse_args_into_dataclasses(argv)
    trainer = Trainer(model_init=lambda: build_model(data), args=args,
                      train_dataset=make_dataset(data.train_samples, data, seed=args.seed),
                      eval_dataset=make_dataset(data.eval_samples, data, seed=args.seed + 1),
                      compute_metrics=accuracy)
    kwargs = {}
    if search.backend == "ray":
        kwargs = {"scheduler": make_scheduler(search.scheduler, args), "verbose": 1}
    best = trainer.hyperparameter_search(
        hp_space=ray_space if search.backend == "ray" else optuna_space, backend=search.backend,
        n_trials=search.n_trials, direction="maximize", compute_objective=lambda metrics: metrics["eval_accuracy"],
        **kwargs)
    print(f"\nbest trial {best.run_id}: eval accuracy {best.objective:.3f} with {best.hyperparameters} "
          f"(chance: {1 / data.num_labels:.3f}); its checkpoints: raytrainer checkpoints {args.output_dir}/run-...")
    return best


if __name__ == "__main__":
    main(sys.argv[1:])
