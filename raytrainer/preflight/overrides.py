"""Refuse a Trainer subclass that overrides a method of transformers' Trainer which raytrainer's loop never calls.

raytrainer runs its own loop on the workers and calls HF's hooks by their names and signatures (docs/getting-
started.md, "Subclass hooks run on every worker"). HF's internal steps (`_inner_training_loop`,
`evaluation_loop`, `_save_checkpoint`, ...) have no counterpart there: an override of one would never run, and
the run would go on without what it changes (a custom evaluation's metrics, a save's extra files). So the
subclass is refused when it is built, naming the methods and the two ways on: override one of raytrainer's
hooks instead, or keep HF's loop by running the subclass of `transformers.Trainer` hosted. A call of one of them
(from a method the subclass overrides legitimately) fails with the same two ways on.

Checked when a Trainer is built, before anything is spent.
"""

from __future__ import annotations

from ..errors import ConfigError

# transformers 5's Trainer methods that raytrainer's Trainer neither has nor calls.
HF_ONLY = frozenset({
    "_inner_training_loop", "_run_epoch", "_maybe_log_save_evaluate", "_evaluate", "evaluation_loop",
    "_save_checkpoint", "_save_optimizer_and_scheduler", "_save_rng_state", "_save_scaler", "_tune_save_checkpoint",
    "_load_from_checkpoint", "_load_optimizer_and_scheduler", "_load_rng_state", "_load_scaler", "_load_best_model",
    "_load_callback_state", "_issue_warnings_after_load", "get_resumed_dataloader",
    "_prepare_input", "_remove_unused_columns", "_get_collator_with_removed_columns",
    "_set_signature_columns_if_needed", "get_batch_samples", "_get_num_items_in_batch",
    "_prepare_context_parallel_inputs", "_track_num_input_tokens", "num_examples",
    "_wrap_model", "_move_model_to_device", "_prepare_for_training", "_init_training_state",
    "set_initial_training_values", "_finalize_training", "create_accelerator_and_postprocess",
    "_build_accelerator_args", "_validate_args", "autocast_smart_context_manager", "call_model_init",
    "_clip_grad_norm", "_get_grad_norm", "_get_learning_rate", "_determine_best_metric", "store_flos",
    "get_total_train_batch_size", "_update_auto_batch_size", "_hp_search_setup", "_report_to_hp_search",
    "_defer_fsdp_gradient_reduction", "_sync_replicated_trainable_parameters", "_has_mixed_mesh_grads",
    "_mixed_mesh_grad_norm", "get_cp_size", "get_sp_size", "get_tp_size",
})


def check_overrides(trainer_class: type, base: type) -> None:
    """`trainer_class`: the user's subclass of `base` (raytrainer's Trainer)."""
    overridden = sorted({name for klass in trainer_class.__mro__ if klass is not base and issubclass(klass, base)
                         for name in vars(klass) if name in HF_ONLY})
    if overridden:
        raise ConfigError(
            f"{trainer_class.__name__} overrides {', '.join(overridden)}: transformers' Trainer calls "
            f"{'them' if len(overridden) > 1 else 'it'}, raytrainer's loop never does, so the override would not "
            f"run. {WAYS_ON}")


def not_here(trainer_class_name: str, name: str) -> AttributeError:
    """What a call of one of these methods gets: a subclass written for transformers calls them too
    (transformers' question-answering example's `evaluate` calls `self.evaluation_loop`)."""
    return AttributeError(f"{trainer_class_name} has no {name}: it is a step of transformers' own loop, which "
                          f"raytrainer's Trainer replaces with its loop on the workers. {WAYS_ON}")


WAYS_ON = ("Override raytrainer's hooks instead (compute_loss, training_step, prediction_step, create_optimizer, "
           "create_scheduler, get_train_dataloader, get_eval_dataloader, log; docs/getting-started.md), or keep "
           "transformers' loop: subclass transformers.Trainer and run it with raytrainer.hosted(...) or "
           "`raytrainer launch` (docs/hosted.md).")
