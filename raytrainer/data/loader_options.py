"""DataLoader options from transformers' `dataloader_*` arguments, for the training and evaluation loaders
alike (transformers passes the same ones to both)."""

from __future__ import annotations


def loader_options(args, device) -> dict:
    options = {"num_workers": args.dataloader_num_workers,
               # Pinned host memory only speeds up copies to a GPU; on a CPU worker it is wasted.
               "pin_memory": bool(args.dataloader_pin_memory) and device.type == "cuda"}
    if args.dataloader_num_workers > 0:  # torch accepts these only with worker processes
        options["persistent_workers"] = args.dataloader_persistent_workers
        if args.dataloader_prefetch_factor is not None:
            options["prefetch_factor"] = args.dataloader_prefetch_factor
        if args.dataloader_multiprocessing_context is not None:
            options["multiprocessing_context"] = args.dataloader_multiprocessing_context
    return options


def main_input_name(model, processing_class) -> str:
    """The input whose length counts (group_by_length) and whose tokens count (include_num_input_tokens_seen):
    the tokenizer's first model input, else the model's main_input_name, else input_ids."""
    names = getattr(processing_class, "model_input_names", None)
    if names:
        return names[0]
    return getattr(model, "main_input_name", "input_ids")
