"""Runnable examples (`python examples/X.py`), and importable parts for `raytrainer train` configs
(`examples.tiny_lm:model` and friends, importable from the repository root)."""
