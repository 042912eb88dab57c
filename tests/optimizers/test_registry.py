"""Every optim name once (the built-in ones and those of their own packages), and Liger's kernels: refused where
they cannot run, checked when the arguments are built (optimizers/registry.py) and in the preflight
(strategy/liger.py)."""

from __future__ import annotations

from raytrainer.optimizers.packaged import NAMES
from raytrainer.optimizers.registry import OPTIMIZERS


def test_every_name_is_an_optim_choice():
    assert set(NAMES) <= set(OPTIMIZERS)
    assert {"galore_adamw", "galore_adamw_8bit", "galore_adafactor", "galore_adamw_layerwise",
            "galore_adamw_8bit_layerwise", "galore_adafactor_layerwise", "apollo_adamw", "apollo_adamw_layerwise",
            "lomo", "adalomo", "grokadamw", "stable_adamw"} == set(NAMES)


def test_each_name_is_listed_once():
    assert len(set(OPTIMIZERS)) == len(OPTIMIZERS)
