"""Model FLOPs per token and the device's peak, for the throughput figures of every log record (meter.py).

The estimate is torchtitan's for a dense transformer: training costs 6 FLOPs per parameter per token
(2 forward, 4 backward) plus 12 * layers * heads * head_dim * seq_len for the attention scores and values
(forward + backward, causal sparsity not discounted, recomputation not counted). Embedding tables are looked
up, not multiplied, so their parameters are left out, unless the output projection shares them (tied).
A model without a transformer config (no layers / heads in `model.config`) counts 6 FLOPs per parameter
per token, and per sample when its batches have no tokens.

MFU divides by the device's dense peak for the precision the run computes in (the table below, from NVIDIA's
data sheets): bf16/fp16 tensor cores under bf16=True/fp16=True, TF32 tensor cores for an fp32 run whose
matmuls may use TF32 (tf32=True, or torch's own setting), else plain fp32. An fp32 run measured against the
bf16 peak would read 15x too low on an H100. `peak_flops_per_device` overrides it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

# Dense (no 2:4 sparsity) FLOP/s per precision, from NVIDIA's data sheets: (bf16/fp16 tensor cores, TF32
# tensor cores, fp32 without tensor cores). Matched in order against torch.cuda.get_device_name(), so a longer
# name comes before its prefix (A100 before A10, L40S before L4). A GPU without TF32 (V100, T4) gets its fp32.
PEAK_FLOPS = (
    ("B200", (2.25e15, 1.1e15, 75e12)),
    ("H200", (989e12, 494.7e12, 66.9e12)),
    ("H100 NVL", (835e12, 417.5e12, 60e12)),
    ("H100 PCIe", (756e12, 378e12, 51.2e12)),
    ("H100", (989e12, 494.7e12, 66.9e12)),  # SXM and other variants
    ("H800", (989e12, 494.7e12, 66.9e12)),
    ("A100", (312e12, 156e12, 19.5e12)),
    ("A800", (312e12, 156e12, 19.5e12)),
    ("L40S", (362e12, 183e12, 91.6e12)),
    ("L40", (181e12, 90.5e12, 90.5e12)),
    ("L4", (121e12, 60e12, 30.3e12)),
    ("A10G", (70e12, 35e12, 31.2e12)),  # AWS's variant: no NVIDIA data sheet; the commonly cited figures
    ("A10", (125e12, 62.5e12, 31.2e12)),
    ("A40", (150e12, 74.8e12, 37.4e12)),
    ("V100", (125e12, 15.7e12, 15.7e12)),  # fp16 tensor cores (V100 has no bf16, no TF32)
    ("T4", (65e12, 8.1e12, 8.1e12)),  # fp16
)
PRECISIONS = ("bf16", "fp16", "tf32", "fp32")  # the columns above: bf16 and fp16 share the first


def run_precision(args=None) -> str:
    """The precision a run's matmuls use: bf16/fp16 from the arguments, else TF32 where torch allows it for
    fp32 matmuls (`tf32=True` sets that on every worker before the loop asks), else fp32."""
    if args is not None and getattr(args, "bf16", False):
        return "bf16"
    if args is not None and getattr(args, "fp16", False):
        return "fp16"
    return "tf32" if _tf32_allowed() else "fp32"


def _tf32_allowed() -> bool:
    matmul = torch.backends.cuda.matmul
    return bool(matmul.allow_tf32) or torch.get_float32_matmul_precision() != "highest" \
        or getattr(matmul, "fp32_precision", None) == "tf32"


def peak_flops(device: torch.device, override: Optional[float] = None,
               precision: str = "bf16") -> Optional[float]:
    """This device's peak FLOP/s in `precision` (one of PRECISIONS; `run_precision(args)` gives a run's): the
    user's figure, else the table's for a known GPU, else None (no MFU)."""
    if override:
        return float(override)
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: one of {PRECISIONS}")
    if device.type != "cuda":
        return None  # a CPU's peak depends on cores, clocks and vector units: ask the user for it
    name = torch.cuda.get_device_name(device)
    column = max(PRECISIONS.index(precision) - 1, 0)  # bf16 and fp16: 0, tf32: 1, fp32: 2
    for key, flops in PEAK_FLOPS:
        if key.lower() in name.lower():
            return flops[column]
    return None


@dataclass(frozen=True)
class ModelFlops:
    """Training FLOPs of one micro-batch: `dense` per token (6 N) + `attention` per token per position."""
    dense: float
    attention: float = 0.0  # 12 * layers * heads * head_dim; times the batch's sequence length

    @classmethod
    def of(cls, model: nn.Module) -> "ModelFlops":
        shape = _attention_shape(getattr(model, "config", None))
        attention = 12.0 * shape[0] * shape[1] * shape[2] if shape else 0.0
        return cls(dense=6.0 * _matmul_params(model), attention=attention)

    def batch(self, samples: int, tokens: int, seq_len: int) -> float:
        if tokens:
            return tokens * (self.dense + self.attention * seq_len)
        return samples * self.dense


def _matmul_params(model: nn.Module) -> int:
    """Parameters used in matmuls: all of them (each counted once), less the embedding tables that only an
    nn.Embedding uses (a tied output projection does multiply by its table)."""
    embedding, elsewhere, total = set(), set(), {}
    for module in model.modules():
        for p in module.parameters(recurse=False):
            total[id(p)] = p.numel()
            (embedding if isinstance(module, nn.Embedding) else elsewhere).add(id(p))
    return sum(n for key, n in total.items() if key not in embedding or key in elsewhere)


def _attention_shape(config) -> Optional[tuple]:
    """(layers, heads, head_dim) from a transformers-style config, or None if it has not all three."""
    if config is None:
        return None

    def first(*names):
        for name in names:
            value = getattr(config, name, None)
            if isinstance(value, int) and value > 0:
                return value
        return None

    layers = first("num_hidden_layers", "n_layer", "n_layers", "num_layers")
    heads = first("num_attention_heads", "n_head", "n_heads", "num_heads")
    hidden = first("hidden_size", "n_embd", "d_model", "dim")
    head_dim = first("head_dim", "d_kv") or (hidden // heads if hidden and heads else None)
    if not (layers and heads and head_dim):
        return None
    return layers, heads, head_dim
