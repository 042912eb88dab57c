"""The prediction step of `Seq2SeqTrainer` with `predict_with_generate=True`: the model generates, and the step's
"logits" are the generated token ids (transformers' `Seq2SeqTrainer.prediction_step`, step for step).

Generated ids and labels shorter than the generation config's max_length (or max_new_tokens + 1) are padded to it
with the pad token id, as transformers pads them, so that batches have one width. Whatever widths still differ
(a batch generated with a larger max_length, another rank's batches) are padded with -100 when the evaluation
loop concatenates and gathers them (worker/host_arrays.py), transformers' rule too: a script's compute_metrics
replaces -100 before decoding. Each rank generates for its contiguous slice of the dataset and the slices are
gathered in rank order, so the rows come back in dataset order.
"""

from __future__ import annotations

import contextlib
from typing import Any, Optional

import torch

from .hooks import call_compute_loss


def resolve_gen_kwargs(args, gen_kwargs: dict) -> dict:
    """The keyword arguments of `generate` for one evaluate()/predict(): those passed win; else
    generation_max_length and generation_num_beams; else (in generate) the model's generation config."""
    gen_kwargs = dict(gen_kwargs)
    if (gen_kwargs.get("max_length") is None and gen_kwargs.get("max_new_tokens") is None
            and getattr(args, "generation_max_length", None) is not None):
        gen_kwargs["max_length"] = args.generation_max_length
    if gen_kwargs.get("num_beams") is None and getattr(args, "generation_num_beams", None) is not None:
        gen_kwargs["num_beams"] = args.generation_num_beams
    return gen_kwargs


def generation_step(trainer, model, inputs: dict, gen_kwargs: dict):
    """(loss, generated ids, labels) of one evaluation batch; `gen_kwargs` already resolved."""
    has_labels = "labels" in inputs
    inputs = trainer._prepare_inputs(inputs)
    gen_kwargs = {k: v for k, v in gen_kwargs.items() if not (k in ("num_beams", "max_length") and v is None)}
    # Under FSDP every forward pass gathers parameters with the other ranks: a rank whose batch finished early
    # must keep stepping until every rank has (transformers' synced_gpus default for sharded models).
    sharded = bool(getattr(trainer.strategy, "shards_state", False) and trainer.ctx.distributed)
    gen_kwargs.setdefault("synced_gpus", sharded)
    generator = trainer.model  # transformers generates with the trainer's model (here: never a DDP wrapper)
    own_config = getattr(trainer, "_generation_config", None)  # Seq2SeqTrainingArguments.generation_config
    if own_config is not None and generator.generation_config is not own_config:
        generator.generation_config = own_config  # a model built by model_init on this worker gets it too
    generation_inputs = inputs
    # decoder_input_ids made from the labels (a collator's) would make generate continue them: leave them out.
    if ("labels" in inputs and "decoder_input_ids" in inputs
            and inputs["labels"].shape == inputs["decoder_input_ids"].shape):
        generation_inputs = {k: v for k, v in inputs.items()
                             if k not in ("decoder_input_ids", "decoder_attention_mask")}
    model.eval()
    with torch.no_grad(), _root_unsharded(generator if sharded else None):
        generated = generator.generate(**generation_inputs, **gen_kwargs)
    config = generator.generation_config
    if config._from_model_config:  # transformers' step: the config is not rebuilt from the model's each batch
        config._from_model_config = False
    config.update(**config._get_default_generation_params(), defaults_only=True)
    width = _padded_width(config, generated.shape[-1])
    if width is not None:
        generated = pad_to_length(generated, width, pad_token_id(trainer))

    loss = None
    if has_labels:
        with torch.no_grad():
            loss, _ = call_compute_loss(trainer, model, inputs, return_outputs=True)
            loss = loss.mean().detach()
    if trainer.args.prediction_loss_only:
        return loss, None, None
    labels = None
    if has_labels:
        labels = inputs["labels"]
        width = _padded_width(config, labels.shape[-1])
        if width is not None:
            labels = pad_to_length(labels, width, pad_token_id(trainer))
    return loss, generated, labels


@contextlib.contextmanager
def _root_unsharded(model):
    """FSDP2: generate calls the encoder (model.get_encoder()) before any forward of the root module, so the root's
    own parameters (a shared embedding) are still sharded there: gathered for the call (transformers summons FSDP1's
    full parameters alike). The blocks gather their own in their forward hooks."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(model, FSDPModule):
        yield
        return
    model.unshard()
    try:
        yield
    finally:
        model.reshard()


def _padded_width(config, width: int) -> Optional[int]:
    """The width transformers pads a batch of `width` tokens to, or None to leave it."""
    if width < config.max_length:
        return config.max_length
    if config.max_new_tokens is not None and width < config.max_new_tokens + 1:
        return config.max_new_tokens + 1
    return None


def pad_to_length(tensor: torch.Tensor, length: int, pad_id: int) -> torch.Tensor:
    padded = torch.full((tensor.shape[0], length), pad_id, dtype=tensor.dtype, device=tensor.device)
    padded[:, :tensor.shape[-1]] = tensor
    return padded


def pad_token_id(trainer) -> Any:
    """transformers' choice: the tokenizer's pad id (else its eos id), else the model config's pad id."""
    tokenizer = trainer.processing_class
    if tokenizer is not None and hasattr(tokenizer, "pad_token_id"):
        return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    pad = getattr(getattr(trainer.model, "config", None), "pad_token_id", None)
    if pad is None:
        raise ValueError("predict_with_generate pads generated ids with a pad token id, and there is none: pass "
                         "the tokenizer as Seq2SeqTrainer(processing_class=...), or set model.config.pad_token_id.")
    return pad
