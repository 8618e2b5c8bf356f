"""Deterministic split assignment by run: every checkpoint of a run lands in the same split.

A run's split depends only on its id, the salt and the fractions, so it is the same on every machine, in every
shard of a distributed build, and when a zoo grows: no run can move between train and test.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping

SPLIT_NAMES = ("train", "validation", "test")
DEFAULT_FRACTIONS: dict[str, float] = {"train": 0.70, "validation": 0.15, "test": 0.15}
DEFAULT_SPLIT_SALT = "stz-v1"  # what ZooWriter uses unless told otherwise: the default reproduces a zoo's splits


def check_fractions(fractions: Mapping[str, float]) -> dict[str, float]:
    """Validate split fractions: known names, non-negative, summing to 1."""
    unknown = sorted(set(fractions) - set(SPLIT_NAMES))
    if unknown:
        raise ValueError(f"unknown split names {unknown}; expected a subset of {list(SPLIT_NAMES)}")
    values = {name: float(fractions.get(name, 0.0)) for name in SPLIT_NAMES}
    if not all(math.isfinite(v) and v >= 0 for v in values.values()) or abs(sum(values.values()) - 1.0) > 1e-9:
        raise ValueError(f"split fractions must be non-negative and sum to 1, got {values}")
    return values


def run_unit_interval(run_id: str, salt: str) -> float:
    """A uniform number in [0, 1) fixed by the run id and the salt (first 8 bytes of a sha256)."""
    digest = hashlib.sha256(f"{salt}\x00{run_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def assign_split(run_id: str, fractions: Mapping[str, float] = DEFAULT_FRACTIONS,
                 salt: str = DEFAULT_SPLIT_SALT) -> str:
    """The split of a run: cumulative fractions cut the run's hashed position in [0, 1)."""
    values = check_fractions(fractions)
    u = run_unit_interval(run_id, salt)
    edge = 0.0
    for name in SPLIT_NAMES:
        edge += values[name]
        if u < edge:
            return name
    return [name for name in SPLIT_NAMES if values[name] > 0][-1]
