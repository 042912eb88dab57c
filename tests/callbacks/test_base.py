"""The driver's callback handler and HF's callback protocol (raytrainer/callbacks/base.py), without Ray: the state
mirror each worker event updates, HF's control resets, what a callback may return, the decision handed to the
workers, and the events after which they wait for it. On real worker groups: tests/callbacks/test_events.py."""

import pytest
import transformers

from raytrainer.callbacks.base import CallbackHandler, TrainerCallback, listens_to, merge_control
from raytrainer.state import TrainerControl, TrainerState
from tests.callbacks.test_events import Count


class Recorder(TrainerCallback):
    def __init__(self):
        self.seen = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.seen.append(("log", state.global_step, dict(logs), kwargs.get("model")))

    def on_step_end(self, args, state, control, **kwargs):
        self.seen.append(("step_end", state.global_step, control.should_save, None))
        if state.global_step == 2:
            return {"should_save": True}


def test_events_update_the_state_mirror_before_the_callbacks_see_it():
    recorder = Recorder()
    handler = CallbackHandler([recorder], args=None, state=TrainerState())
    handler.context = {"model": "the model"}
    handler.handle({"kind": "train_begin", "global_step": 0, "max_steps": 9, "best_metric": 0.5})
    for step in (1, 2, 3):
        handler.handle({"kind": "step_end", "global_step": step, "epoch": step / 3})
        handler.handle({"kind": "log", "global_step": step, "logs": {"loss": 1.0 / step, "step": step}})
    state = handler.state
    assert (state.max_steps, state.best_metric, state.global_step, state.epoch) == (9, 0.5, 3, 1.0)
    assert [h["step"] for h in state.log_history] == [1, 2, 3]
    assert recorder.seen[2] == ("step_end", 2, False, None) and recorder.seen[3][3] == "the model"
    # A restarted group replays the steps after its checkpoint (step 1): their logs are forgotten, the restart kept.
    handler.handle({"kind": "restart", "global_step": 1, "reason": "failure", "cause": "rank 1 died"})
    assert [h["step"] for h in state.log_history] == [1]
    assert state.restarts[0]["reason"] == "failure" and state.restarts[0]["cause"] == "rank 1 died"


def test_a_decision_carries_the_one_off_requests_once_and_a_training_stop_for_good():
    class StopAtThree(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            control.should_evaluate = True
            control.should_training_stop = state.global_step == 3

    handler = CallbackHandler([StopAtThree()], args=None, state=TrainerState())
    handler.handle({"kind": "step_end", "global_step": 3})
    first = handler.take_control()
    assert first["should_evaluate"] and first["should_training_stop"] and not first["should_save"]
    second = handler.take_control()
    assert not second["should_evaluate"] and second["should_training_stop"]
    handler.handle({"kind": "step_begin", "global_step": 4})  # HF's reset at each step: log/evaluate/save only
    assert handler.control.should_training_stop and not handler.control.should_log


def test_a_callback_may_return_hfs_control_a_dict_or_nothing_but_no_unknown_flag():
    control = TrainerControl()
    merge_control(control, transformers.TrainerControl(should_log=True))
    merge_control(control, {"should_save": True, "should_evaluate": False})
    merge_control(control, None)
    assert (control.should_log, control.should_save, control.should_evaluate) == (True, True, False)
    with pytest.raises(ValueError, match="control flag 'should_explode'"):
        merge_control(control, {"should_explode": True})


def test_only_methods_a_callback_implements_count_as_listening_ours_or_hfs_base():
    class HFStyle(transformers.TrainerCallback):
        def on_evaluate(self, args, state, control, **kwargs):
            pass

    assert listens_to(HFStyle(), "evaluate") and not listens_to(HFStyle(), "step_end")
    assert listens_to(Recorder(), "log") and not listens_to(TrainerCallback(), "log")
    handler = CallbackHandler([Recorder()], args=None, state=TrainerState())
    handler.add(HFStyle)  # a class is instantiated, as HF's add_callback does
    assert isinstance(handler.callbacks[-1], HFStyle) and isinstance(handler.pop(HFStyle), HFStyle)
    assert len(handler.callbacks) == 1
    assert handler.pop(Count) is None


def test_control_points_follow_what_steering_callbacks_listen_to():
    class OnEvaluate(TrainerCallback):
        def on_evaluate(self, args, state, control, **kwargs):
            control.should_training_stop = True

    class OnSubstep(TrainerCallback):
        def on_substep_end(self, args, state, control, **kwargs):
            pass

    handler = CallbackHandler([Count(), OnEvaluate()], None, None)
    assert handler.control_points() == {"evaluate"}  # an early stopper costs nothing per step
    handler.add(OnSubstep)
    assert handler.control_points() == {"evaluate", "step_end"}


def test_every_transformers_callback_method_has_ours_to_call_super_on():
    """A callback written for transformers calls super().on_<event>(...): each must exist here (on_push_begin
    was missing)."""
    theirs = {name for name in vars(transformers.TrainerCallback) if name.startswith("on_")}
    assert theirs <= {name for name in dir(TrainerCallback) if name.startswith("on_")}
