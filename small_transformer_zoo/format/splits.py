"""Deterministic split assignment by run (or by family of runs): every checkpoint of a run lands in the same split.

A run's split depends only on its id, the salt and the fractions, so it is the same on every machine, in every
shard of a distributed build, and when a zoo grows: no run can move between train and test.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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


SPLIT_UNITS = ("run", "family")
FAMILY_VARIES_DEFAULT = ("l2", "w_init_std")
FAMILY_KEYS = ("optimizer", "learning_rate", "dropout", "w_init_std", "l2", "train_fraction")


@dataclass(frozen=True)
class SplitRule:
    """How a zoo's runs are split (the manifest's `splits`).

    `by="run"`: each run is hashed alone. `by="family"`: runs that share every hyperparameter except those in
    `varies` (default: L2 and init std) are one family, hashed together, so near-clones that differ only in those
    settings never straddle train and test (docs/design.md section 5).
    """

    by: str = "run"
    fractions: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_FRACTIONS))
    salt: str = DEFAULT_SPLIT_SALT
    varies: tuple[str, ...] = FAMILY_VARIES_DEFAULT

    def __post_init__(self) -> None:
        if self.by not in SPLIT_UNITS:
            raise ValueError(f"unknown split unit {self.by!r}; choose from {list(SPLIT_UNITS)}")
        unknown = sorted(set(self.varies) - set(FAMILY_KEYS))
        if unknown:
            raise ValueError(f"family hyperparameters {unknown} are not among {list(FAMILY_KEYS)}")
        object.__setattr__(self, "fractions", check_fractions(self.fractions))
        object.__setattr__(self, "varies", tuple(self.varies))

    def unit(self, row: Mapping[str, Any]) -> str:
        """What is hashed for a row: its run id, or its family's key."""
        if self.by == "run":
            return str(row["run_id"])
        return "family:" + "|".join(f"{k}={row.get(k)!r}" for k in FAMILY_KEYS if k not in self.varies)

    def assign(self, row: Mapping[str, Any]) -> str:
        """The split of a row's run (every checkpoint of a run, and of a family, gets the same one)."""
        return assign_split(self.unit(row), self.fractions, self.salt)

    def to_manifest(self) -> dict[str, Any]:
        out: dict[str, Any] = {"by": "run_id" if self.by == "run" else "family", "fractions": dict(self.fractions),
                               "salt": self.salt}
        if self.by == "family":
            out["varies"] = list(self.varies)
        return out

    @classmethod
    def from_manifest(cls, rule: Mapping[str, Any]) -> "SplitRule":
        by = {"run_id": "run", "family": "family"}.get(rule.get("by"))  # type: ignore[arg-type]
        if by is None:
            raise ValueError(f"'by' is {rule.get('by')!r}, not 'run_id' or 'family'")
        return cls(by, rule["fractions"], rule["salt"], tuple(rule.get("varies", FAMILY_VARIES_DEFAULT)))

    def describe(self) -> str:
        """One phrase for tables and cards."""
        return "by run" if self.by == "run" else f"by family (runs differing only in {', '.join(self.varies)})"
