"""transformers' fluent setters on `TrainingArguments` (`args.set_training(...).set_evaluate(...)`): each sets the
fields transformers' sets, with its defaults, and returns the arguments; they are then checked again as at
construction (a value raytrainer refuses raises here, naming the fix, and the fields keep their old values)."""

from __future__ import annotations

from typing import Any, Optional

from ..errors import ConfigError


def _name(value) -> str:
    """A name given as transformers' enum (IntervalStrategy, SchedulerType, OptimizerNames, ...) or as its string."""
    return str(getattr(value, "value", value))


def _positive_steps(strategy: str, steps, what: str) -> None:
    if strategy == "steps" and not steps:
        raise ConfigError(f"{what}(strategy='steps') needs a positive number of steps.")


class Setters:
    def _set(self, **fields: Any):
        before = {name: getattr(self, name) for name in fields}
        for name, value in fields.items():
            setattr(self, name, value)
        try:
            self.__post_init__()
        except Exception:
            for name, value in before.items():
                setattr(self, name, value)
            raise
        return self

    def set_training(self, learning_rate: float = 5e-5, batch_size: int = 8, weight_decay: float = 0,
                     num_epochs: float = 3, max_steps: int = -1, gradient_accumulation_steps: int = 1, seed: int = 42,
                     activation_checkpointing: bool = False, gradient_checkpointing: Optional[bool] = None):
        if gradient_checkpointing is not None:  # transformers 5's deprecated spelling
            activation_checkpointing = gradient_checkpointing
        return self._set(do_train=True, learning_rate=learning_rate, per_device_train_batch_size=batch_size,
                         weight_decay=weight_decay, num_train_epochs=num_epochs, max_steps=max_steps,
                         gradient_accumulation_steps=gradient_accumulation_steps, seed=seed,
                         activation_checkpointing=activation_checkpointing,
                         gradient_checkpointing=activation_checkpointing)

    def set_evaluate(self, strategy: str = "no", steps: int = 500, batch_size: int = 8,
                     accumulation_steps: Optional[int] = None, delay: Optional[float] = None, loss_only: bool = False):
        strategy = _name(strategy)
        _positive_steps(strategy, steps, "set_evaluate")
        return self._set(eval_strategy=strategy, do_eval=strategy != "no", eval_steps=steps,
                         per_device_eval_batch_size=batch_size, eval_accumulation_steps=accumulation_steps,
                         eval_delay=0 if delay is None else delay,  # transformers sets None, its loop reads 0
                         prediction_loss_only=loss_only)

    def set_testing(self, batch_size: int = 8, loss_only: bool = False):
        return self._set(do_predict=True, per_device_eval_batch_size=batch_size, prediction_loss_only=loss_only)

    def set_save(self, strategy: str = "steps", steps: int = 500, total_limit: Optional[int] = None,
                 on_each_node: bool = False):
        strategy = _name(strategy)
        _positive_steps(strategy, steps, "set_save")
        return self._set(save_strategy=strategy, save_steps=steps, save_total_limit=total_limit,
                         save_on_each_node=on_each_node)

    def set_logging(self, strategy: str = "steps", steps: int = 500, report_to="none", level: str = "passive",
                    first_step: bool = False, nan_inf_filter: bool = False, on_each_node: bool = False,
                    replica_level: str = "passive"):
        strategy = _name(strategy)
        _positive_steps(strategy, steps, "set_logging")
        return self._set(logging_strategy=strategy, logging_steps=steps, report_to=report_to, log_level=level,
                         logging_first_step=first_step, logging_nan_inf_filter=nan_inf_filter,
                         log_on_each_node=on_each_node, log_level_replica=replica_level)

    def set_push_to_hub(self, model_id: str, strategy: str = "every_save", token: Optional[str] = None,
                        private_repo: Optional[bool] = None, always_push: bool = False, revision: Optional[str] = None):
        return self._set(push_to_hub=True, hub_model_id=model_id, hub_strategy=_name(strategy), hub_token=token,
                         hub_private_repo=private_repo, hub_always_push=always_push, hub_revision=revision)

    def set_optimizer(self, name: str = "adamw_torch", learning_rate: float = 5e-5, weight_decay: float = 0,
                      beta1: float = 0.9, beta2: float = 0.999, epsilon: float = 1e-8, args: Optional[str] = None):
        return self._set(optim=_name(name), learning_rate=learning_rate,
                         weight_decay=weight_decay, adam_beta1=beta1, adam_beta2=beta2, adam_epsilon=epsilon,
                         optim_args=args)

    def set_lr_scheduler(self, name: str = "linear", num_epochs: float = 3.0, max_steps: int = -1,
                         warmup_steps: float = 0):
        return self._set(lr_scheduler_type=_name(name), num_train_epochs=num_epochs,
                         max_steps=max_steps, warmup_steps=warmup_steps)

    def set_dataloader(self, train_batch_size: int = 8, eval_batch_size: int = 8, drop_last: bool = False,
                       num_workers: int = 0, pin_memory: bool = True, persistent_workers: bool = False,
                       prefetch_factor: Optional[int] = None, multiprocessing_context: Optional[str] = None,
                       in_order: bool = True, auto_find_batch_size: bool = False, ignore_data_skip: bool = False,
                       sampler_seed: Optional[int] = None):
        """`num_workers` is the DataLoader's (dataloader_num_workers), not raytrainer's workers."""
        return self._set(per_device_train_batch_size=train_batch_size, per_device_eval_batch_size=eval_batch_size,
                         dataloader_drop_last=drop_last, dataloader_num_workers=num_workers,
                         dataloader_pin_memory=pin_memory, dataloader_persistent_workers=persistent_workers,
                         dataloader_prefetch_factor=prefetch_factor,
                         dataloader_multiprocessing_context=multiprocessing_context, dataloader_in_order=in_order,
                         auto_find_batch_size=auto_find_batch_size, ignore_data_skip=ignore_data_skip,
                         data_seed=sampler_seed)
