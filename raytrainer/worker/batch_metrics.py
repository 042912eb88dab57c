"""batch_eval_metrics: `compute_metrics` called once per evaluation step instead of once on everything, so the
predictions of the whole set are never held (transformers' meaning).

Each step, every rank hands its batch's (logits, labels) to one `all_gather_object`; rank 0 calls
`compute_metrics(EvalPrediction(predictions, label_ids), compute_result=...)` with that step's batches of all
ranks (rank order, padded with -100 like the full evaluation), as CPU tensors. `compute_result` is True on the
last call, whose returned dict is the evaluation's metrics. Ranks may hold different numbers of batches (and
a Ray Dataset's count is known only at its end), so each gather also says whether a rank still had one;
rank 0 keeps one step back, to know which call is the last.
"""

from __future__ import annotations

import inspect
from typing import Any, Optional

import torch

from ..errors import ConfigError
from ..state import EvalPrediction
from .host_arrays import concat_padded, to_numpy


def check_compute_metrics(compute_metrics) -> None:
    """transformers' rule: with batch_eval_metrics, compute_metrics must take `compute_result`."""
    if compute_metrics is None:
        return
    try:
        parameters = inspect.signature(compute_metrics).parameters
    except (TypeError, ValueError):
        return
    if "compute_result" not in parameters and not any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
        raise ConfigError("batch_eval_metrics=True: compute_metrics must take a `compute_result` argument "
                          "(True on the last evaluation step, when it returns the summary metrics): "
                          "def compute_metrics(eval_pred, compute_result): ...")


class BatchMetrics:
    def __init__(self, trainer):
        check_compute_metrics(trainer.compute_metrics)  # evaluate() alone is not checked on the driver
        self.compute = trainer.compute_metrics
        self.ctx = trainer.ctx
        self.pending: Optional[list] = None  # rank 0: the last step's batches, not yet handed over
        self.metrics: dict = {}

    def add(self, logits: Any, labels: Any, inputs: Any = None, losses: Any = None):
        """This rank's batch of the current step (every rank calls it once per step it has a batch); `inputs` and
        `losses`: include_for_metrics' (evaluation.MetricExtras)."""
        self._step((to_numpy(logits), to_numpy(labels), inputs, losses), True)

    def finish(self) -> dict:
        """After this rank's last batch: keep pairing the other ranks' steps until every rank is done. Returns
        the last call's metrics (on rank 0; {} elsewhere)."""
        while self._step(None, False):
            pass
        if self.pending:
            self._call(self.pending, last=True)
            self.pending = None
        return self.metrics

    def _step(self, batch: Optional[tuple], has_batch: bool) -> bool:
        gathered = self.ctx.all_gather_object((has_batch, batch))
        batches = [g[1] for g in gathered if g[0] and g[1][0] is not None and g[1][1] is not None]
        if not any(g[0] for g in gathered):
            return False
        if self.ctx.is_main and batches:
            if self.pending:
                self._call(self.pending, last=False)
            self.pending = batches
        return True

    def _call(self, batches: list, last: bool):
        predictions, label_ids, losses = (_tensors(concat_padded([b[i] for b in batches])) for i in (0, 1, 3))
        inputs = None  # include_for_metrics' "inputs": the step's batch, a dict, as transformers passes it
        if batches[0][2] is not None:
            inputs = {key: _tensors(concat_padded([b[2][key] for b in batches])) for key in batches[0][2]}
        result = self.compute(EvalPrediction(predictions=predictions, label_ids=label_ids, inputs=inputs,
                                             losses=losses), compute_result=last)
        if last:
            self.metrics = dict(result or {})


def _tensors(value: Any) -> Any:
    if isinstance(value, (tuple, list)):
        return type(value)(_tensors(v) for v in value)
    return torch.from_numpy(value) if value is not None else None
