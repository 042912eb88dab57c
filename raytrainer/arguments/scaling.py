"""`num_workers`: a fixed count, or an elastic `(min, max)` range handed to Ray Train V2's ScalingConfig; its
spellings (parse_workers, NumWorkers for the argument parsers), its one form (normalise_workers) and the check
of an elastic range's global batch.

An elastic run may train at any world size in [min, max], and changes size only at a restart. Its global
batch is fixed once, as per_device_train_batch_size x gradient_accumulation_steps x max (the full size):
at a smaller size the accumulation grows, so every world size in the range must divide it evenly. That is
arithmetic on the arguments alone, so it is checked here, before anything starts.
"""

from __future__ import annotations

import argparse
import math
import re
from functools import reduce
from typing import Any, Tuple, Union

from ..errors import ConfigError

Workers = Union[int, Tuple[int, int]]


def parse_workers(value: Any) -> Workers:
    """The command line's and YAML's spellings: "2", "1,2", "1-2" (as torchrun's --nnodes), "(1, 2)", "[1, 2]" (a
    YAML list arrives as a list)."""
    if not isinstance(value, str):
        return value
    text = value.strip().strip("()[]")
    if re.fullmatch(r"\d+\s*-\s*\d+", text):
        text = text.replace("-", ",")
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int or 'MIN,MAX' (e.g. 2 or 1,4), got {value!r}") from None
    if len(numbers) == 1 and "," not in text:
        return numbers[0]
    return tuple(numbers)


class NumWorkers(tuple):
    """num_workers as the command line writes it, "2" or "1,4". Argument parsers (ours and transformers'
    HfArgumentParser) convert a field's text by calling the class its annotation names: this one returns an
    int or a (min, max) tuple, which TrainingArguments then normalises and checks."""

    def __new__(cls, text: Any):
        return parse_workers(text)


def normalise_workers(value: Any) -> Workers:
    """An int >= 0, or a (min, max) tuple with 1 <= min <= max. A list of two becomes a tuple."""
    if _is_int(value):
        if value < 0:
            raise ConfigError(f"num_workers={value!r} must be an int >= 0 (0 runs in the driver process), or a "
                              "(min, max) range for an elastic run.")
        return value
    if isinstance(value, (list, tuple)):
        if len(value) != 2 or not all(_is_int(v) for v in value):
            raise ConfigError(f"num_workers={value!r}: an elastic range is two integers (min, max), e.g. (1, 4).")
        low, high = value
        if low < 1:
            raise ConfigError(f"num_workers={tuple(value)!r}: the minimum of an elastic range must be >= 1 (a run "
                              "needs at least one worker to continue); for a driver-process run use num_workers=0.")
        if low > high:
            raise ConfigError(f"num_workers={tuple(value)!r}: min ({low}) is larger than max ({high}); write "
                              f"({high}, {low}).")
        return (low, high)
    raise ConfigError(f"num_workers={value!r} must be an int >= 0 or a (min, max) range of two ints.")


def bounds(value: Workers) -> Tuple[int, int]:
    return (value, value) if isinstance(value, int) else value


class WorkerRange:
    """`min_workers`, `max_workers` and `elastic` of anything with a normalised `num_workers` (TrainingArguments,
    the coordinator's RunSpec, the hosted options)."""

    @property
    def min_workers(self) -> int:
        return bounds(self.num_workers)[0]

    @property
    def max_workers(self) -> int:
        """The most workers the run uses; 0 for a driver-process run."""
        return bounds(self.num_workers)[1]

    @property
    def elastic(self) -> bool:
        """num_workers is a (min, max) range with min < max."""
        return self.min_workers != self.max_workers


def check_elastic_batch(value: Workers, per_device: int, accumulation: int):
    """Every world size of the range must split the global batch (per_device x accumulation x max) into whole
    micro-batches per rank; say which accumulation does."""
    low, high = bounds(value)
    if low == high:
        return
    bad = [m for m in range(low, high + 1) if (accumulation * high) % m]
    if not bad:
        return
    every = reduce(lambda a, b: a * b // math.gcd(a, b), range(low, high + 1))
    fix = every // math.gcd(every, high)
    raise ConfigError(
        f"num_workers={value!r}: the global batch ({per_device} x {accumulation} accumulation x {high} workers = "
        f"{per_device * accumulation * high} samples) cannot be kept at {', '.join(map(str, bad))} worker(s): it "
        f"is not a whole number of micro-batches per worker. Set gradient_accumulation_steps to a multiple of "
        f"{fix}, or narrow the range.")


def accumulation_at(accumulation: int, high: int, world_size: int) -> int:
    """The accumulation that keeps the elastic run's global batch at `world_size` workers."""
    return accumulation * high // world_size


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
