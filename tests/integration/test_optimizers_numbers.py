"""The optimizers of their own packages (GaLore, APOLLO, LOMO/AdaLomo, GrokAdamW, StableAdamW) give transformers'
numbers: every logged loss, grad_norm and learning rate and the weights after 3 steps of a tiny Llama equal those
of transformers' Trainer in one process, in our process (num_workers=0) and on 2 workers with the same global
batch; and a run resumed from a checkpoint ends with the uninterrupted run's weights.

The reference is transformers' Trainer with two changes that do not touch its optimizers' arithmetic:
- its sampler yields our order of the rows (`epoch_order`), so that the micro-batches of an accumulated step
  are the same rows (LOMO updates the weights at every micro-batch, so their order matters);
- the mend of its layer-wise optimizers: transformers 5 builds the schedule on the accelerate-wrapped optimizer,
  where `get_scheduler` does not recognise a `LayerWiseDummyOptimizer`, so each parameter's optimizer keeps the
  initial learning rate while the logged one decays (and `LayerWiseDummyScheduler` fails on torch 2.13). The
  mended reference adds the per-parameter schedules `get_scheduler` means to add; raytrainer applies the schedule.
And AdaLomo's constructor calls `.cuda()`, which a CPU-only torch refuses: both sides build raytrainer's
CPU-safe subclass (same arithmetic).
"""

from __future__ import annotations

import pytest
import torch

from raytrainer import Trainer, TrainingArguments
from raytrainer.data.collator import DefaultCollator
from raytrainer.data.sampler import epoch_order
from tests.hf_models import tiny_model, tiny_rows
from tests.models import weights

transformers = pytest.importorskip("transformers")

STEPS = 3
LR = 1e-2
RTOL = 1e-4
LOGGED = ("loss", "grad_norm", "learning_rate")
TARGETS = ["q_proj", "v_proj", "down_proj"]


def _installed(optim: str) -> bool:
    from raytrainer.optimizers.packaged import missing_package

    return missing_package(optim) is None


def _settings(optim: str) -> dict:
    """optim_args and target modules: rank 4 of 32, projections renewed every 2 steps (so within the run)."""
    if optim.startswith(("galore", "apollo")):
        return {"optim_args": "rank=4,update_proj_gap=2", "optim_target_modules": TARGETS}
    return {}


# ---------------------------------------------------------------------- transformers' Trainer, the reference
class _OurOrder(torch.utils.data.Sampler):
    """Our sampler's order of the rows, one epoch per pass."""

    def __init__(self, n: int, seed: int = 0):
        self.n, self.seed, self.epoch = n, seed, 0

    def __len__(self):
        return self.n

    def __iter__(self):
        order = epoch_order(self.n, self.seed, self.epoch, shuffle=True).tolist()
        self.epoch += 1
        return iter(order)


class _ReferenceTrainer(transformers.Trainer):
    def _get_train_sampler(self, *args, **kwargs):
        return _OurOrder(len(self.train_dataset))

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        from transformers.trainer_pt_utils import LayerWiseDummyOptimizer

        scheduler = super().create_scheduler(num_training_steps, optimizer)
        inner = getattr(self.optimizer, "optimizer", None)
        if isinstance(inner, LayerWiseDummyOptimizer) and not getattr(self, "_mended", False):
            self._mended = True  # the mend (module docstring)
            per_parameter = {p: transformers.get_scheduler(self.args.lr_scheduler_type, optimizer, num_warmup_steps=0,
                                                           num_training_steps=num_training_steps)
                             for p, optimizer in inner.optimizer_dict.items()}
            for p in per_parameter:
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(lambda p: per_parameter[p].step())
        return scheduler


def reference(optim: str, tmp_path, batch: int, accumulation: int, monkeypatch) -> dict:
    import lomo_optim

    from raytrainer.optimizers.lomo_classes import AdaLomo

    monkeypatch.setattr(lomo_optim, "AdaLomo", AdaLomo)  # transformers imports it from there when it builds one
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / f"hf-{optim}"), per_device_train_batch_size=batch,
        gradient_accumulation_steps=accumulation, max_steps=STEPS, learning_rate=LR, logging_steps=1,
        save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, optim=optim, seed=0,
        **_settings(optim))
    trainer = _ReferenceTrainer(model=tiny_model("llama"), args=args, train_dataset=tiny_rows("llama"),
                                data_collator=DefaultCollator())
    trainer.train()
    return {"logs": _steps(trainer.state.log_history), "weights": weights(trainer.model)}


# ---------------------------------------------------------------------- ours
def _args(optim: str, output_dir: str, workers: int, batch: int, accumulation: int, **kw) -> TrainingArguments:
    settings = dict(max_steps=STEPS, learning_rate=LR, logging_steps=1, save_strategy="no", report_to="none",
                    disable_tqdm=True, seed=0, **_settings(optim))
    return TrainingArguments(output_dir=output_dir, num_workers=workers, per_device_train_batch_size=batch,
                             gradient_accumulation_steps=accumulation, optim=optim, **{**settings, **kw})


def ours(trainer: Trainer, optim: str, tmp_path, workers: int, batch: int, accumulation: int) -> dict:
    trainer.model = tiny_model("llama")
    trainer.train_dataset = tiny_rows("llama")
    trainer.args = _args(optim, str(tmp_path / f"rt-{optim}-{workers}x{batch}x{accumulation}"), workers, batch,
                         accumulation)
    trainer.train()
    return {"logs": _steps(trainer.state.log_history), "weights": weights(trainer.model)}


def _steps(history: list) -> dict:
    return {h["step"]: {k: h[k] for k in LOGGED if k in h} for h in history if "loss" in h}


def relative_differences(ref: dict, got: dict) -> dict:
    """The largest relative difference of each logged value, and of the weights (each tensor's largest absolute
    difference over its largest absolute value)."""
    assert got["logs"].keys() == ref["logs"].keys()
    worst = {}
    for step, values in ref["logs"].items():
        for key, value in values.items():
            mine = got["logs"][step][key]
            worst[key] = max(worst.get(key, 0.0), abs(mine - value) / max(abs(value), 1e-9))
    worst["weights"] = max((got["weights"][n] - t).abs().max().item() / max(t.abs().max().item(), 1e-9)
                           for n, t in ref["weights"].items())
    return worst


# In our process: what runs only there (the layer-wise forms) and LOMO with accumulation; every other optimizer
# is compared on 2 workers below, against the same one-process reference.
@pytest.mark.parametrize("optim, batch, accumulation", [
    ("galore_adamw_layerwise", 8, 1), ("apollo_adamw_layerwise", 8, 1),
    ("lomo", 4, 2),  # LOMO updates at every micro-batch: with accumulation, as transformers
])
def test_one_process_equals_transformers(optim, batch, accumulation, tmp_path, monkeypatch):
    if not _installed(optim):
        pytest.skip(f"{optim}'s package is not installed")
    ref = reference(optim, tmp_path, batch, accumulation, monkeypatch)
    with Trainer(model=tiny_model("llama"), args=TrainingArguments(output_dir=str(tmp_path),
                                                                               num_workers=0),
                              train_dataset=tiny_rows("llama")) as trainer:
        got = ours(trainer, optim, tmp_path, 0, batch, accumulation)
    if optim.endswith("_layerwise") or optim.endswith("lomo"):  # no gradient is left for clipping, as in HF
        assert all(v["grad_norm"] == 0.0 for v in got["logs"].values())
    worst = relative_differences(ref, got)
    assert max(worst.values()) <= RTOL, worst


# What transformers runs on several processes, on 2 workers with the one-process global batch of 8 rows.
TWO_WORKER_CASES = [("galore_adamw", 4, 1), ("galore_adafactor", 2, 2), ("apollo_adamw", 4, 1), ("lomo", 2, 2),
                    ("adalomo", 4, 1), ("grokadamw", 2, 2), ("stable_adamw", 4, 1)]


def test_two_workers_equal_transformers_in_one_process(ray_session, tmp_path, monkeypatch):
    """One Trainer (one worker group) runs every case; every difference above RTOL is listed."""
    cases = [c for c in TWO_WORKER_CASES if _installed(c[0])]
    found = {}
    # No close(): the group stays in the pool for the next test, as for a script's next Trainer.
    trainer = Trainer(model=tiny_model("llama"), args=TrainingArguments(output_dir=str(tmp_path), num_workers=2),
                      train_dataset=tiny_rows("llama"))
    for optim, batch, accumulation in cases:
        ref = reference(optim, tmp_path, 2 * batch, accumulation, monkeypatch)
        worst = relative_differences(ref, ours(trainer, optim, tmp_path, 2, batch, accumulation))
        if max(worst.values()) > RTOL:
            found[f"{optim} 2x{batch}x{accumulation}"] = worst
    assert found == {}


# ---------------------------------------------------------------------- exact resume
@pytest.mark.parametrize("optim", ["galore_adamw_layerwise", "adalomo", "grokadamw"])
def test_resumed_run_ends_with_the_uninterrupted_weights(optim, tmp_path):
    """The optimizer's whole state is in the checkpoint: GaLore's projectors (renewed every 2 steps) inside each
    layer-wise optimizer, AdaLomo's factored moments, GrokAdamW's moments
    (the package's own state_dict loses them)."""
    if not _installed(optim):
        pytest.skip(f"{optim}'s package is not installed")

    def run(name: str, resume=None) -> Trainer:
        args = _args(optim, str(tmp_path / name), 0, 8, 1, save_strategy="steps", save_steps=2, max_steps=5)
        trainer = Trainer(model=tiny_model("llama"), args=args, train_dataset=tiny_rows("llama"))
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    full = run("full")
    resumed = run("resumed", resume=str(tmp_path / "full" / "checkpoint-2"))
    assert resumed.state.global_step == 5
    for name, tensor in weights(full.model).items():
        torch.testing.assert_close(weights(resumed.model)[name], tensor, rtol=0, atol=0, msg=name)
