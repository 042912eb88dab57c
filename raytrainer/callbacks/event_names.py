"""The events of a run, in the order the loop fires them. The loop, in pseudocode:

    on_init_end                          Trainer(...) built (driver)
    on_train_begin                       workers built the model, optimizer, resumed; before the first step
    [evaluate, on_evaluate]              eval_on_start
    for epoch:
        on_epoch_begin
        for each optimizer step (an accumulation group of micro-batches):
            on_step_begin
            forward/backward per micro-batch; on_substep_end after each but the last
            clip gradients -> on_pre_optimizer_step -> optimizer.step() -> on_optimizer_step
            scheduler step, zero grads, global_step += 1
            on_step_end
            if due or control.should_log:       log -> on_log
            if due or control.should_evaluate:  evaluate (on_prediction_step per batch) -> on_evaluate
            if due or control.should_save or stopping: save -> on_save (when the checkpoint is committed)
            if control.should_epoch_stop or control.should_training_stop: leave the epoch
        on_epoch_end -> epoch-interval log / evaluate / save
        if control.should_training_stop: stop
    on_train_end
    predict(): on_prediction_step per batch, on_predict     evaluate(): on_prediction_step, on_evaluate

Ours, between worker groups: on_preempted (the group saved at a step boundary and hands over to Ray Train),
on_restart (a new group resumed: after a failure, a preemption or a resize), then on_resize if its world
size differs from the previous group's.

Every event reaches a driver callback exactly once whatever the world size: rank 0 reports the run's
events (the other ranks report only their own figures, folded into `on_log`'s `rank_stats`). A control flag
a callback sets or returns is applied by every rank at the same global step (see `worker/loop_events.py`).
"""

from __future__ import annotations

# Event name -> callback method. `preempted`, `restart` and `resize` are ours (see above).
EVENTS = (
    "init_end", "train_begin", "epoch_begin", "step_begin", "substep_end", "pre_optimizer_step",
    "optimizer_step", "step_end", "log", "evaluate", "prediction_step", "save", "epoch_end", "train_end",
    "predict", "preempted", "restart", "resize",
)

# Events fired on every optimizer step: a driver callback that can change control and listens to one of them
# is consulted at every step end.
PER_STEP = frozenset({"step_begin", "substep_end", "pre_optimizer_step", "optimizer_step", "step_end"})

# The per-step events the driver needs for nothing of its own (its state mirror reads step_end): rank 0 sends
# them only when a driver callback implements them (`CallbackHandler.heard`), so a step costs one event.
UNHEARD_UNLESS_LISTENED = frozenset({"step_begin", "substep_end", "pre_optimizer_step", "optimizer_step"})

# Events after which the loop can act on a control decision, and so may consult the driver.
DECISION_POINTS = frozenset({"train_begin", "epoch_begin", "step_end", "log", "evaluate", "epoch_end"})


def method_name(event: str) -> str:
    return "on_" + event
