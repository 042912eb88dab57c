"""Mixed precision on a worker: autocast for the forward, a gradient scaler for fp16.

bf16 needs no loss scaling (its exponent range is fp32's); fp16 does, so its loss is scaled before backward
and the gradients unscaled before clipping and the optimizer step (`torch.amp.GradScaler`). Under FSDP the
parameters themselves are cast by FSDP's `MixedPrecisionPolicy` (see fsdp.py), so autocast stays off there.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import torch


def compute_dtype(args) -> Optional[torch.dtype]:
    if args is None:
        return None
    return torch.bfloat16 if args.bf16 else torch.float16 if args.fp16 else None


class Precision:
    def __init__(self, args, device: torch.device, autocast: bool = True):
        self.device = device
        self.dtype = compute_dtype(args)
        if self.dtype is torch.float16 and device.type != "cuda":
            # The driver refuses this before any actor starts; a worker without a GPU can still land here.
            raise RuntimeError(f"fp16=True needs a GPU, but this worker runs on {device}: use bf16=True.")
        if self.dtype is torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise RuntimeError(f"bf16=True, but {torch.cuda.get_device_name(device)} has no bf16 support: "
                               "use fp16=True.")
        self.use_autocast = autocast and self.dtype is not None
        self.scaler = torch.amp.GradScaler(device.type) if self.dtype is torch.float16 else None

    def autocast(self):
        if not self.use_autocast:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor):
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale(self, optimizer):
        """Before reading gradients (clipping): bring fp16-scaled gradients back to their true values."""
        if self.scaler is not None and optimizer is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer):
        if self.scaler is None:
            optimizer.step()
            return
        self.scaler.step(optimizer)  # skipped when the gradients overflowed; the scale then shrinks
        self.scaler.update()
