"""The optimizers of transformers' Trainer that live in their own packages: GaLore, APOLLO, LOMO/AdaLomo,
GrokAdamW, StableAdamW; and Liger kernels. Built with transformers' arguments and defaults
(`transformers.trainer_optimizer`), so a run matches transformers' Trainer in one process.

- `registry`: each optimizer's package, pip extra, `optim_args` and the rules checked on the driver.
- `low_rank`: GaLore and APOLLO (projected gradients of `optim_target_modules`).
- `layerwise`: the `_layerwise` forms, one optimizer per parameter stepped inside backward (one process only).
- `lomo`: LOMO and AdaLomo, which update each parameter inside backward (`fused_backward`).
- `grokadamw`: GrokAdamW with its state where checkpoints find it.
- `liger`: Liger's Triton kernels patched into a transformers model (GPU only).
"""

from .liger import apply_liger_kernel
from .lomo import fused_backward, is_fused_backward
from .registry import NAMES, check_args, check_run, create, handles

__all__ = ["NAMES", "apply_liger_kernel", "check_args", "check_run", "create", "fused_backward", "handles",
           "is_fused_backward"]
