"""What a checkpoint holds: HF-loadable files, retention that keeps the newest and the best, best-model
loading, and save_only_model checkpoints, resumed from their weights with a fresh optimizer."""

import os

import pytest
import torch

from raytrainer import Trainer, TrainingArguments
from raytrainer.checkpoint.listing import list_checkpoints
from raytrainer.checkpoint.model_io import load_model_state
from tests.hf_models import tiny_model
from tests.models import TokenData, assert_same_weights, make_model, weights

transformers = pytest.importorskip("transformers")


def tiny_gpt2():
    return tiny_model("gpt2", vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                      resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1)


class CausalData(torch.utils.data.Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(0)
        self.rows = [torch.randint(0, 32, (int(torch.randint(4, 12, (1,), generator=g)),), generator=g)
                     for _ in range(n)]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, i):
        return {"input_ids": self.rows[i], "labels": self.rows[i].clone()}


def test_transformers_model_checkpoint_loads_with_from_pretrained_and_state_with_load_from_json(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), num_workers=0, max_steps=3, save_steps=3, logging_steps=1,
                             per_device_train_batch_size=4, learning_rate=1e-2, disable_tqdm=True)
    trainer = Trainer(model=tiny_gpt2(), args=args, train_dataset=CausalData(16))
    trainer.train()
    ckpt = str(tmp_path / "checkpoint-3")
    assert {"config.json", "model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state_0.pth",
            "trainer_state.json", "training_args.json", "COMMITTED"} <= set(os.listdir(ckpt))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(ckpt)
    assert_same_weights(weights(loaded), weights(trainer.model))
    state = transformers.TrainerState.load_from_json(os.path.join(ckpt, "trainer_state.json"))
    assert state.global_step == 3 and state.log_history
    trainer.save_model(str(tmp_path / "final"))
    assert_same_weights(weights(transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "final"))),
                        weights(trainer.model))


def test_retention_keeps_newest_and_best_then_only_the_best_at_end_whose_model_is_loaded(tmp_path):
    """transformers' save_total_limit=1 with a best: the best and the newest while training, only the best once
    it ends (transformers deletes the newest at the end too)."""
    scores = iter([1.0, 3.0, 2.0, 0.0])  # evaluations at steps 2, 4, 6, 8: the best is step 4, not the newest

    def metrics(p):
        return {"score": next(scores)}

    args = TrainingArguments(output_dir=str(tmp_path), num_workers=0, max_steps=8, per_device_train_batch_size=4,
                             eval_strategy="steps", eval_steps=2, save_steps=2, save_total_limit=1,
                             load_best_model_at_end=True, metric_for_best_model="score", disable_tqdm=True)
    committed_at_saves = []

    class Watch(transformers.TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            committed_at_saves.append({c.step for c in list_checkpoints(str(tmp_path)) if c.committed})

    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(40),
                      eval_dataset=TokenData(9, seed=1), compute_metrics=metrics, callbacks=[Watch()])
    trainer.train()
    state = trainer.state
    assert committed_at_saves == [{2}, {4}, {4, 6}, {4, 8}]  # the best and the newest
    assert [h["eval_score"] for h in state.log_history if "eval_score" in h] == [1.0, 3.0, 2.0, 0.0]
    assert state.best_metric == 3.0 and state.best_model_checkpoint.endswith("checkpoint-4")
    kept = {c.step for c in list_checkpoints(str(tmp_path)) if c.committed}
    assert kept == {4}
    assert_same_weights(weights(trainer.model), load_model_state(state.best_model_checkpoint))


def test_save_only_model_checkpoint_resumes_from_its_weights_with_a_fresh_optimizer(tmp_path, caplog):
    args = TrainingArguments(output_dir=str(tmp_path), num_workers=0, max_steps=2, save_steps=2,
                             save_only_model=True, disable_tqdm=True)
    first = Trainer(model=make_model(), args=args, train_dataset=TokenData(16))
    first.train()
    assert not os.path.exists(tmp_path / "checkpoint-2" / "optimizer.pt")
    longer = TrainingArguments(output_dir=str(tmp_path), num_workers=0, max_steps=4, save_steps=2, logging_steps=1,
                               save_only_model=True, disable_tqdm=True)
    trainer = Trainer(model=make_model(seed=7), args=longer, train_dataset=TokenData(16))
    with caplog.at_level("WARNING", logger="raytrainer"):
        trainer.train(resume_from_checkpoint=True)  # as transformers: the weights, a fresh optimizer, a warning
    assert "save_only_model=True" in caplog.text and "fresh optimizer" in caplog.text
    assert trainer.state.global_step == 4
    # The linear schedule continues at the saved step: step 3 uses the learning rate of step 2 of 4.
    learning_rates = {h["step"]: h["learning_rate"] for h in trainer.state.log_history if "learning_rate" in h}
    assert learning_rates[3] == pytest.approx(5e-5 * (1 - 2 / 4))


def test_synchronous_and_background_saves_write_the_same_checkpoint(tmp_path):
    states = {}
    for save_async in (True, False):
        out = str(tmp_path / str(save_async))
        args = TrainingArguments(output_dir=out, num_workers=0, max_steps=4, save_steps=2, save_async=save_async,
                                 disable_tqdm=True, seed=1)
        Trainer(model=make_model(), args=args, train_dataset=TokenData(24)).train()
        states[save_async] = load_model_state(os.path.join(out, "checkpoint-2"))
    assert_same_weights(states[True], states[False], atol=0)


def test_epoch_strategies_save_and_evaluate_at_every_epoch_end_including_the_last(tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), num_workers=0, num_train_epochs=2, per_device_train_batch_size=8,
                             save_strategy="epoch", eval_strategy="epoch", logging_strategy="epoch",
                             disable_tqdm=True)
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(20), eval_dataset=TokenData(5))
    trainer.train()  # 20 samples in batches of 8: 3 steps per epoch
    assert {c.step for c in list_checkpoints(str(tmp_path)) if c.committed} == {3, 6}
    assert [h["step"] for h in trainer.state.log_history if "eval_loss" in h] == [3, 6]
    assert [h["step"] for h in trainer.state.log_history if "loss" in h] == [3, 6]


def test_a_failed_delete_at_the_end_of_save_total_limit_1_leaves_the_checkpoints_and_the_run_done(
        tmp_path, monkeypatch, caplog):
    """The end's deletion is housekeeping after the training is done: a storage error there is a warning."""
    from raytrainer.checkpoint import retention

    def unreachable(*args, **kwargs):
        raise OSError("storage unreachable")

    monkeypatch.setattr(retention, "keep_only_best", unreachable)
    scores = iter([3.0, 1.0])
    args = TrainingArguments(output_dir=str(tmp_path), num_workers=0, max_steps=4, per_device_train_batch_size=4,
                             eval_strategy="steps", eval_steps=2, save_steps=2, save_total_limit=1,
                             metric_for_best_model="score", storage_retry_timeout_s=0, disable_tqdm=True)
    trainer = Trainer(model=make_model(), args=args, train_dataset=TokenData(40), eval_dataset=TokenData(9, seed=1),
                      compute_metrics=lambda p: {"score": next(scores)})
    with caplog.at_level("WARNING", logger="raytrainer"):
        assert trainer.train().global_step == 4
    assert "the checkpoints other than the best stay" in caplog.text and "storage unreachable" in caplog.text
    assert {c.step for c in list_checkpoints(str(tmp_path)) if c.committed} == {2, 4}
