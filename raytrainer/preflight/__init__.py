"""Checks on the driver before any actor starts (principle 4: fail before spending). Each failure is a
`ConfigError` (or a `StorageError`) that names the problem and the fix.

`Trainer` runs them in this order:

    launchers.py   Trainer(...): a script started by torchrun, accelerate launch, mpirun or deepspeed
    overrides.py   Trainer(...): a subclass overriding a method of transformers' Trainer that our loop never calls
    inputs.py      train(): the datasets (map-style, not empty, a Ray Dataset's length), eval_strategy's
                   eval_dataset, on_nonfinite_loss, batch_eval_metrics' compute_metrics, NEFTune's embedding;
                   evaluate() / predict(): their dataset
    loss.py        train(): the loss on two samples, on the driver (labels kept, a scalar with a gradient)
    placement.py   train(), with Ray connected: the workers can be placed, CPUs left for Ray Data, no local
                   output_dir on several nodes, output_dir writable (the storage probe)
    strategy.py    train(), once the workers' devices are known: precision, compile backend, FSDP blocks, what
                   the optimizer needs, a resume's checkpoint format and world size

`TrainingArguments` checks each field alone at construction (`arguments/`); these are the checks that need the
model, the datasets, the cluster or the storage.
"""

from . import inputs, launchers, loss, overrides, placement, strategy

__all__ = ["inputs", "launchers", "loss", "overrides", "placement", "strategy"]
