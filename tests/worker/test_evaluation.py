"""The evaluation loop (raytrainer/worker/evaluation.py), in process: when it runs (eval_on_start, eval_delay) and
the prediction memory it holds on the device (eval_accumulation_steps)."""

from __future__ import annotations

from raytrainer import Trainer
from raytrainer.worker.evaluation import PredictionBuffer, evaluation_loop
from raytrainer.worker_context import WorkerContext
from tests.models import TokenData, make_model
from tests.test_trainer_features import args


def test_eval_on_start_evaluates_before_step_1_and_eval_delay_skips_early_evaluations(tmp_path):
    trainer = Trainer(model=make_model(), args=args(tmp_path, eval_strategy="steps", eval_steps=2, eval_delay=3,
                                                    eval_on_start=True),
                      train_dataset=TokenData(40), eval_dataset=TokenData(10, seed=3))
    trainer.train()
    assert [h["step"] for h in trainer.state.log_history if "eval_loss" in h] == [0, 4, 6]


def test_eval_accumulation_steps_bounds_the_prediction_memory_held_on_the_device(tmp_path):
    data = TokenData(40, seed=2)
    peaks = {}
    for steps in (None, 2):
        trainer = Trainer(model=make_model(), args=args(tmp_path, per_device_eval_batch_size=4,
                                                        eval_accumulation_steps=steps))
        trainer.ctx = WorkerContext()
        buffer = PredictionBuffer(trainer.args.eval_accumulation_steps)
        output = evaluation_loop(trainer, trainer.get_eval_dataloader(data), buffer=buffer)
        peaks[steps] = (buffer.peak_device_bytes, output)
    (all_at_end, out_all), (every_2, out_2) = peaks[None], peaks[2]
    assert every_2 * 4 <= all_at_end  # 10 batches held at once vs 2
    assert out_all.metrics["eval_loss"] == out_2.metrics["eval_loss"]
    assert (out_all.predictions == out_2.predictions).all()
