"""transformers' names for a hyperparameter search: `BestRun` and `default_hp_space_ray` (the driver's).

Imported from transformers where it is installed (an extra: `raytrainer[hf]`), so that a user's script that
compares or unpacks them gets the very same types; the same definitions here otherwise (transformers 5.x's
`trainer_utils`), so the search runs without transformers. `default_compute_objective` is report.py's: it runs
in every trial's actor, which would otherwise import transformers for it (4.6 s of each actor's start here).
"""

from __future__ import annotations

from typing import Any, Dict, NamedTuple, Optional

from .report import default_compute_objective  # noqa: F401  (transformers' name, here too)

try:  # the same objects as transformers' own, where it is installed
    from transformers.trainer_utils import BestRun, default_hp_space_ray
except ImportError:  # pragma: no cover - exercised where transformers is absent
    class BestRun(NamedTuple):  # type: ignore[no-redef]
        """The best run of a hyperparameter search: its id (its checkpoints are under output_dir/run-<id>),
        objective, hyperparameters, and the backend's summary (Ray Tune's `ResultGrid`)."""

        run_id: str
        objective: Any
        hyperparameters: Dict[str, Any]
        run_summary: Optional[Any] = None

    def default_hp_space_ray(trial=None) -> Dict[str, Any]:  # type: ignore[misc]
        """transformers' default Ray Tune space: learning rate, epochs, seed, batch size."""
        from ray import tune

        return {
            "learning_rate": tune.loguniform(1e-6, 1e-4),
            "num_train_epochs": tune.choice(list(range(1, 6))),
            "seed": tune.uniform(1, 40),
            "per_device_train_batch_size": tune.choice([4, 8, 16, 32, 64]),
        }
