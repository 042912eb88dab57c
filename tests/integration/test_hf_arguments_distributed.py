"""The issue-15 fields whose meaning spans ranks, on 2 Ray workers in one run (a worker group costs ~15 s here):
the input-token count reduced over ranks, batch_eval_metrics pairing both ranks' batches, group_by_length
sharding one global order, and the driver callbacks' states reaching rank 0's checkpoint."""

import os

from raytrainer import EarlyStoppingCallback, Trainer, TrainingArguments
from raytrainer.checkpoint.listing import read_trainer_state
from tests.arguments.test_transformers_behaviour import RunningAccuracy
from tests.models import TokenData, make_model


def test_two_workers_count_tokens_batch_metrics_and_callback_states(tmp_path, ray_session):
    data, evals = TokenData(24), TokenData(10, seed=1)
    args = TrainingArguments(output_dir=str(tmp_path), num_workers=2, per_device_train_batch_size=2, max_steps=3,
                             per_device_eval_batch_size=2, eval_strategy="steps", eval_steps=3, save_steps=3,
                             logging_steps=1, include_num_input_tokens_seen="non_padding",
                             train_sampling_strategy="group_by_length", batch_eval_metrics=True,
                             metric_for_best_model="rows", disable_tqdm=True)
    # On the pool's idle 2-worker group, kept for the next test as a script's next Trainer would find it.
    trainer = Trainer(model=make_model(), args=args, train_dataset=data, eval_dataset=evals,
                      compute_metrics=RunningAccuracy(), callbacks=[EarlyStoppingCallback(3)])
    trainer.train()
    state = trainer.state
    # The same global batches in one process (group_by_length orders by the global batch): the same tokens.
    alone = Trainer(model=make_model(), args=TrainingArguments(
        output_dir=str(tmp_path / "alone"), num_workers=0, per_device_train_batch_size=4, max_steps=3,
        save_strategy="no", include_num_input_tokens_seen="non_padding", train_sampling_strategy="group_by_length",
        disable_tqdm=True), train_dataset=data)
    alone.train()
    assert state.num_input_tokens_seen == alone.state.num_input_tokens_seen > 0
    logged = [h for h in state.log_history if "num_input_tokens_seen" in h]
    assert logged[-1]["num_input_tokens_seen"] == state.num_input_tokens_seen
    evaluation = [h for h in state.log_history if "eval_rows" in h][-1]
    assert evaluation["eval_rows"] == 10 and evaluation["eval_calls"] == 3  # 5 rows per rank: 3 batches each, 3 steps
    stored = read_trainer_state(os.path.join(str(tmp_path), "checkpoint-3"))["stateful_callbacks"]
    assert stored["EarlyStoppingCallback"]["args"]["early_stopping_patience"] == 3
