"""`raytrainer.hosted(...)` on the session's Ray: a team's own Trainer subclass built on each of 2 workers from
its class and arguments; driver callbacks see each event once and stop every rank at one step; the driver's
model gets the trained weights; evaluate() and predict() after it; a second trainer reuses the warm group."""

from __future__ import annotations

import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

import raytrainer
from raytrainer.checkpoint.listing import list_checkpoints
from tests.hosted.plain_script import Rows


class TeamTrainer(Trainer):
    """Overrides a hook, as a team's trainer does: the loss it logs is the model's, doubled then halved."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs=return_outputs,
                                    num_items_in_batch=num_items_in_batch)
        return loss if return_outputs else (loss * 2) / 2


class Recorder(TrainerCallback):
    """On the driver: every event it sees, and a stop at step 3 (every rank must stop there)."""

    def __init__(self):
        self.seen = []

    def on_step_end(self, args, state, control, **kwargs):
        self.seen.append(("step_end", state.global_step))
        if state.global_step == 3:
            control.should_training_stop = True

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.seen.append(("log", state.global_step))


def tiny_llama():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64))


def test_a_subclass_trains_on_two_workers_under_driver_control(ray_session, tmp_path):
    model = tiny_llama()
    initial = {k: v.clone() for k, v in model.state_dict().items()}
    args = TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=8, save_steps=100, logging_steps=1,
                             per_device_train_batch_size=2, learning_rate=1e-3, report_to="none", use_cpu=True,
                             disable_tqdm=True)
    recorder = Recorder()
    trainer = raytrainer.hosted(TeamTrainer, num_workers=2, disable_tqdm=True, report_to="tensorboard",
                                logging_dir=str(tmp_path / "tb"))(
        model=model, args=args, train_dataset=Rows(), eval_dataset=Rows(12), callbacks=[recorder])
    output = trainer.train()
    events = [name for name in os.listdir(tmp_path / "tb") if name.startswith("events.out.tfevents")]
    assert events, "the TensorBoard reporter did not run on the driver"

    assert output.global_step == 3  # the driver's stop reached both ranks at step 3
    assert [s for kind, s in recorder.seen if kind == "step_end"] == [1, 2, 3]  # each event once
    assert [s for kind, s in recorder.seen if kind == "log"] == [1, 2, 3, 3]  # 3 steps, then the final metrics
    assert [h["step"] for h in trainer.state.log_history if "loss" in h] == [1, 2, 3]
    assert trainer.state.log_history[-1]["epoch"] == 3 * 2 * 2 / len(Rows())  # 2 ranks x 2 rows a step
    changed = [name for name, value in model.state_dict().items() if not torch.equal(value, initial[name])]
    assert changed, "the driver's model did not receive the trained weights"
    assert args.output_dir == str(tmp_path / "run")  # the driver's arguments object is left as it was

    metrics = trainer.evaluate()
    assert set(metrics) >= {"eval_loss", "eval_runtime"} and metrics["eval_loss"] > 0
    prediction = trainer.predict(Rows(6))
    assert prediction.predictions.shape[:2] == (6, 12)  # every row once, in order, across the 2 ranks
    trainer.save_model(str(tmp_path / "final"))  # HF's save_model on the workers, with the trained weights
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "final" / "model.safetensors"))
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items() if k in saved)

    again = raytrainer.hosted(Trainer, num_workers=2, disable_tqdm=True)(
        model=tiny_llama(), args=TrainingArguments(output_dir=str(tmp_path / "second"), max_steps=2, use_cpu=True,
                                                   report_to="none", disable_tqdm=True, save_strategy="no"),
        train_dataset=Rows())
    assert again.train().global_step == 2
    assert again._pool_user.group is trainer._pool_user.group  # the warm group, not a new one


def test_save_total_limit_1_ends_with_only_the_best_checkpoint_on_s3_as_hf_ends_locally(ray_session, s3_bucket,
                                                                                         s3_server):
    """HF's end of training with save_total_limit=1 and a best deletes every local checkpoint but the best; a
    remote output_dir's committed copies go the same way (the hosted mode rotates those itself)."""
    url, options = s3_bucket + "/best-only", dict(s3_server.storage_options)
    # greater_is_better on the eval loss, which falls: the first evaluation (step 2) stays the best.
    args = TrainingArguments(output_dir=url, max_steps=6, eval_strategy="steps", eval_steps=2, save_steps=2,
                             save_total_limit=1, load_best_model_at_end=True, metric_for_best_model="loss",
                             greater_is_better=True, learning_rate=1e-2, per_device_train_batch_size=2,
                             use_cpu=True, report_to="none", disable_tqdm=True)
    trainer = raytrainer.hosted(Trainer, num_workers=2, disable_tqdm=True, storage_options=options)(
        model=tiny_llama(), args=args, train_dataset=Rows(), eval_dataset=Rows(12))
    assert trainer.train().global_step == 6
    # The driver's state is rank 0's whole one, its best named by the URL (not a worker's staging folder).
    assert trainer.state.best_model_checkpoint == url + "/checkpoint-2"
    assert trainer.state.best_metric == [h["eval_loss"] for h in trainer.state.log_history if "eval_loss" in h][0]
    assert [(i.step, i.committed) for i in list_checkpoints(url, options)] == [(2, True)]
