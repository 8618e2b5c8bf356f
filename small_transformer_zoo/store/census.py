"""How a zoo's runs relate to each other: its seed policy and a census of near-clones across its splits
(docs/design.md section 5).

Runs trained from one seed with settings that differ only slightly (L2 of 1e-8 against 1e-7) end as near-clones.
Split by run, such a pair can put one run in training and its twin in test, and a benchmark then rewards
memorising. The census measures it: for every run of a split, the distance between the direction of its
checkpoint at one epoch and that of the nearest other training run's checkpoint at that epoch (`|w/|w| - w'/|w'||`:
a near-clone of equal norm at its relative distance, unrelated networks near sqrt(2) whatever their norms), on the
raw weights and on their canonical forms (`weights.canonical`), which also catches clones that differ by a
symmetry of the paper's group.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow.compute as pc
import torch

from ..errors import DataError
from ..format.splits import SplitRule
from ..weights.canonical import canonicalize_params
from .reader import Zoo
from .seeding import seed_policy

CLONE_DISTANCE = 0.01      # a run whose nearest training run's direction is this close counts as having a clone
UNRELATED = 1.2            # a nearest direction this far or farther is as far as unrelated networks lie (sqrt(2))
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
CANDIDATES = 4             # nearest rows by the float32 matmul whose exact distances are then compared
CHUNK = 256                # query rows per distance block


def default_epoch(zoo: Zoo) -> int:
    """The census's epoch: the latest epoch that every run stores (imported best checkpoints, epoch -1, excluded)."""
    table = zoo.metadata("train").select(["run_id", "epoch"])
    runs = len(pc.unique(table.column("run_id")))
    counts = Counter(e for e in table.column("epoch").to_pylist() if e >= 1)
    full = [e for e, n in counts.items() if n >= runs]
    if not full and not counts:
        raise DataError(f"{zoo.dir}: the training split stores no checkpoint with an epoch")
    return max(full) if full else max(counts)


@dataclass
class SplitCensus:
    """One split's distances to the nearest training run (raw and canonical), one per run."""

    split: str
    runs: int
    raw: np.ndarray
    canonical: np.ndarray

    def summary(self, within: float) -> dict[str, Any]:
        def describe(distances: np.ndarray) -> dict[str, Any]:
            return {"within": float(np.mean(distances <= within)) if distances.size else None,
                    "quantiles": {f"{q:g}": float(np.quantile(distances, q)) if distances.size else None
                                  for q in QUANTILES}}
        return {"runs": self.runs, "raw": describe(self.raw), "canonical": describe(self.canonical)}


def _rows_at(zoo: Zoo, split: str, epoch: int) -> torch.Tensor:
    """The split's checkpoints saved after `epoch` (one per run; diverged ones left out)."""
    return zoo.split_weights(split).rows(zoo.select(split, where={"epoch": epoch, "is_best": False}))


def directions(rows: torch.Tensor) -> torch.Tensor:
    """Each row divided by its norm, in float64 (a row of zeros stays zeros)."""
    rows = rows.double()
    return rows / rows.norm(dim=1, keepdim=True).clamp_min(1e-300)


def nearest_distances(queries: torch.Tensor, reference: torch.Tensor, exclude_self: bool = False) -> np.ndarray:
    """Distance `|q/|q| - r/|r||` from each query row's direction to the nearest reference row's. The distance of
    directions does not favour small weights: by Euclidean or relative distance, a network unrelated to every other
    is nearest to whichever one collapsed to the smallest norm; here unrelated directions lie near sqrt(2) whatever
    their norms, and a near-clone of equal norm lies at its relative distance (`CLONE_DISTANCE` of 0.01 is 1%). The
    nearest few are found by a float32 matmul, then their distances computed exactly in float64."""
    if len(reference) <= int(exclude_self):
        return np.full(len(queries), np.nan)
    reference_unit = directions(reference)
    reference32 = reference_unit.float()
    k = min(CANDIDATES + int(exclude_self), len(reference))
    out = []
    for start in range(0, len(queries), CHUNK):
        chunk = directions(queries[start : start + CHUNK])
        scores = -(chunk.float() @ reference32.T)
        rows = torch.arange(start, start + len(chunk))
        if exclude_self:
            scores[torch.arange(len(chunk)), rows] = torch.inf
        candidates = scores.topk(k, dim=1, largest=False).indices
        exact = (chunk[:, None, :] - reference_unit[candidates]).norm(dim=-1)
        if exclude_self:  # with few rows the row itself is among the candidates
            exact = exact.masked_fill(candidates == rows[:, None], torch.inf)
        out.append(exact.min(1).values.numpy())
    return np.concatenate(out)


def clone_census(zoo: Zoo, epoch: int | None = None, canonical: bool = True) -> tuple[int, list[SplitCensus]]:
    """The epoch used and, per split, each run's distance to its nearest other training run at that epoch."""
    epoch = default_epoch(zoo) if epoch is None else epoch
    train = _rows_at(zoo, "train", epoch)
    if not len(train):
        raise DataError(f"{zoo.dir}: no training checkpoint at epoch {epoch}")
    train_canonical = canonicalize_params(train, zoo.spec) if canonical else train[:0]
    out = []
    for split in zoo.splits:
        rows = train if split == "train" else _rows_at(zoo, split, epoch)
        same = split == "train"
        raw = nearest_distances(rows, train, exclude_self=same)
        canon = nearest_distances(canonicalize_params(rows, zoo.spec), train_canonical, exclude_self=same) \
            if canonical and len(rows) else np.zeros(0)
        out.append(SplitCensus(split, len(rows), raw, canon))
    return epoch, out


def census_report(zoo: Zoo, epoch: int | None = None, within: float = CLONE_DISTANCE,
                  canonical: bool = True) -> dict[str, Any]:
    """The census as a JSON-able summary: seed policy, split rule, epoch, and per split the share of runs with a
    training run within `within` and the quantiles of the distances."""
    epoch, splits = clone_census(zoo, epoch, canonical)
    return {"config": zoo.config, "seed_policy": seed_policy(zoo.manifest, map(zoo.metadata, zoo.splits)),
            "split_rule": SplitRule.from_manifest(zoo.manifest["splits"]).describe(), "epoch": epoch,
            "within": within, "canonical": canonical, "splits": {s.split: s.summary(within) for s in splits}}


def format_census(report: dict[str, Any]) -> str:
    """The census as the lines `stz info --clones` prints."""
    within = report["within"]
    lines = [f"near-clones of {report['config']} at epoch {report['epoch']} ({report['seed_policy']} seeds, splits "
             f"{report['split_rule']}): per split, the share of runs whose nearest other training run is within a "
             f"distance of {within:g} between weight directions (|w/|w| - w'/|w'||; unrelated networks lie near "
             f"1.41), and the quantiles of that distance",
             f"  {'split':<11}{'runs':>6}  {'form':<10}{'within':>8}   " +
             "  ".join(f"q{float(q) * 100:02.0f}" .rjust(7) for q in report["splits"]["train"]["raw"]["quantiles"])]
    for split, row in report["splits"].items():
        for form in ("raw", "canonical") if report["canonical"] else ("raw",):
            part = row[form]
            share = "-" if part["within"] is None else f"{100 * part['within']:.1f}%"
            quantiles = "  ".join(("-" if v is None else f"{v:.4f}").rjust(7) for v in part["quantiles"].values())
            lines.append(f"  {split if form == 'raw' else '':<11}{row['runs'] if form == 'raw' else '':>6}  "
                         f"{form:<10}{share:>8}   {quantiles}")
    lines += [f"  {line}" for line in clone_words(report)]
    return "\n".join(lines)


def clone_words(report: dict[str, Any]) -> list[str]:
    """The census in words where it says that no run is near another: per split without a clone, how far its
    runs' nearest training runs are."""
    out = []
    for split, row in report["splits"].items():
        raw = row["raw"]
        if raw["within"] == 0 and raw["quantiles"].get("0.5") is not None:
            median = raw["quantiles"]["0.5"]
            kind = "as far as unrelated networks are" if median > UNRELATED else "closer than unrelated networks"
            out.append(f"no {split} run has a training run within {report['within']:g}: the median distance to the "
                       f"nearest is {median:.2f}, {kind} (about 1.41)")
    return out
