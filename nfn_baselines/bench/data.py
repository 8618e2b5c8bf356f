"""The data a benchmark trains and scores on: a zoo's splits after one selection, one protocol, one target.

The protocols are those of `protocols`.

Rows are chosen by the package's one selection rule (`Zoo.select`: diverged checkpoints and repeated weights are
left out unless asked for), so the benchmark scores the checkpoints every other read path returns.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from small_transformer_zoo import Zoo
from small_transformer_zoo.hub.opening import open_zoo
from small_transformer_zoo.errors import DataError
from small_transformer_zoo.format.architecture import ArchitectureSpec
from small_transformer_zoo.format.splits import FAMILY_KEYS, SPLIT_NAMES, SplitRule
from small_transformer_zoo.weights.align import align_params, reference_row
from small_transformer_zoo.weights.canonical import canonicalize_params
from small_transformer_zoo.weights.standardize import WeightStats
from small_transformer_zoo.weights.symmetry import randomize_params
from small_transformer_zoo.weights.weight_space import TransformerWeights

from ..models.fitting import SplitData
from ..models.targets import Target, get_target
from .protocols import protocol_where

PREPROCESSING = ("none", "standardize", "canonical", "both", "align")
# The fewest checkpoints per split a condition is trained on: a model, an epoch picked on validation, a tau.
MIN_CHECKPOINTS = {"train": 4, "validation": 2, "test": 2}


@dataclass
class Condition:
    """One training set-up of a benchmark: the splits a model trains, selects and is tested on, and the accuracy
    threshold they were filtered at (`paper` protocol; None: no filter)."""

    name: str
    splits: dict[str, SplitData]
    threshold: float | None = None

    def shortfall(self) -> str | None:
        """Why the models cannot be trained and scored on this condition (too few checkpoints left in a split
        after a threshold's filter), or None."""
        counts = {k: len(s) for k, s in self.splits.items()}
        if all(counts[k] >= least for k, least in MIN_CHECKPOINTS.items()):
            return None
        return ", ".join(f"{k} {counts[k]}" for k in MIN_CHECKPOINTS)


@dataclass
class BenchData:
    spec: ArchitectureSpec
    splits: dict[str, SplitData]
    target: Target
    protocol: str = "all-checkpoints"
    epoch: int | None = None
    preprocess: str = "none"
    stats: WeightStats | None = None
    where: dict[str, Any] = field(default_factory=dict)
    split_salt: str | None = None
    split_rule: SplitRule = field(default_factory=SplitRule)
    randomize: str | None = None

    @property
    def test_ids(self) -> list[str]:
        return self.splits["test"].metadata.column("checkpoint_id").to_pylist()

    def conditions(self, thresholds: Sequence[float]) -> list[Condition]:
        """`all-checkpoints`: one condition; `paper`: one on everything and one per threshold, each split
        filtered to the checkpoints whose test accuracy reaches the threshold."""
        everything = Condition("all", self.splits)
        if self.protocol != "paper":
            return [everything]
        return [everything] + [Condition(f">={t:g}", {k: s.subset(s.accuracy >= t) for k, s in self.splits.items()},
                                         t) for t in thresholds]

    def describe(self) -> dict[str, Any]:
        """What the data is, for the results JSON."""
        return {"target": self.target.name, "protocol": self.protocol, "epoch": self.epoch,
                "preprocess": self.preprocess, "where": {k: _jsonable(v) for k, v in self.where.items()},
                "split_salt": self.split_salt, "split_rule": self.split_rule.to_manifest(),
                "randomize": self.randomize, "weight_stats": self.stats.to_dict() if self.stats else None,
                "splits": {k: {"runs": s.run_count, "checkpoints": len(s)} for k, s in self.splits.items()}}


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset, tuple)):
        return sorted(value, key=repr) if not isinstance(value, tuple) else list(value)
    return value


@dataclass(frozen=True)
class DataSelection:
    """Which data a benchmark reads from a zoo: what `BenchRequest.data_selection` passes down the benchmark path.

    `preprocess`: "canonical" puts every checkpoint in its canonical form, "standardize" applies statistics of the
    training split (pooled as `small_transformer_zoo.weights.standardize` says), "both" does the first, then the
    second; "align" permutes every checkpoint to match one training checkpoint (`weights.align`, the reference
    chosen by `reference_row` from the training split alone); every model sees the same preprocessed weights. `split_salt`: the runs are split again by this salt
    (the zoo's own fractions) instead of the zoo's own split. `split_by`: "run" or "family" (`SplitRule`): the runs
    split again with that unit when it is not the zoo's own. `train_runs`: the share of training runs kept (a
    seeded draw of whole runs), for learning curves. `randomize`: every checkpoint moved by a random element of
    that symmetry group (`randomize_params`) before any model sees it."""

    preprocess: str = "none"
    target: str = "test_accuracy"
    protocol: str = "all-checkpoints"
    epoch: int | None = None
    where: Mapping[str, Any] = field(default_factory=dict)
    split_salt: str | None = None
    train_runs: float = 1.0
    train_runs_seed: int = 0
    split_by: str | None = None
    randomize: str | None = None

    def __post_init__(self) -> None:
        if self.preprocess not in PREPROCESSING:
            raise ValueError(f"unknown preprocessing {self.preprocess!r}; choose from {list(PREPROCESSING)}")
        if not 0 < self.train_runs <= 1:
            raise ValueError(f"train_runs must be a share in (0, 1], got {self.train_runs}")
        get_target(self.target)


def load_bench_data(zoo: Zoo | str | os.PathLike[str], config: str | None = None, preprocess: str = "none",
                    **options: Any) -> BenchData:
    """Weights, target and test accuracy per split of a zoo given itself or by name (`open_zoo`), selected as a
    `DataSelection` of these keywords says (`target`, `protocol`, `epoch`, `where`, `split_salt`, `train_runs`,
    `train_runs_seed`, `split_by`, `randomize`)."""
    selection = DataSelection(preprocess=preprocess, **options)
    return read_bench_data(open_zoo(zoo, config), selection)


def read_bench_data(zoo: Zoo, selection: DataSelection) -> BenchData:
    """Weights, target and test accuracy per split, selected by `selection.where` (`Zoo.select`) and the protocol,
    split, drawn, randomized and preprocessed as `selection` says."""
    chosen = get_target(selection.target)
    where, epoch = protocol_where(zoo, selection.protocol, selection.epoch, selection.where)
    splits = {name: _read_split(zoo, name, where, chosen) for name in SPLIT_NAMES}
    own = SplitRule.from_manifest(zoo.manifest["splits"])
    rule = replace(own, by=selection.split_by or own.by,
                   salt=selection.split_salt if selection.split_salt is not None else own.salt)
    if rule != own:
        splits = _resplit(splits, rule)
    if selection.train_runs < 1:
        splits["train"] = _keep_runs(splits["train"], selection.train_runs, selection.train_runs_seed)
    for name, split in splits.items():
        if split.run_count < 2:
            raise DataError(f"{zoo.dir}: split {name!r} has {len(split)} usable checkpoints of {split.run_count} "
                            f"runs after the selection; the benchmark needs at least 2 runs in every split")
    if selection.randomize is not None:
        splits = {k: replace(s, params=randomize_params(s.params, zoo.spec, selection.randomize,
                                                        s.metadata.column("checkpoint_id").to_pylist()))
                  for k, s in splits.items()}
    splits, stats = _preprocess(splits, zoo.spec, selection.preprocess)
    return BenchData(zoo.spec, splits, chosen, selection.protocol, epoch, selection.preprocess, stats, where,
                     selection.split_salt, rule, selection.randomize)


def _preprocess(splits: dict[str, SplitData], spec: ArchitectureSpec,
                preprocess: str) -> tuple[dict[str, SplitData], WeightStats | None]:
    """Every split in canonical form and/or standardised by the training split's statistics (`DataSelection`)."""
    stats = None
    if preprocess == "align":  # every split to one training checkpoint (`weights.align`): fitted on training only
        train = splits["train"].params
        reference = train[reference_row(train)]
        splits = {k: replace(s, params=align_params(s.params, reference, spec)) for k, s in splits.items()}
    if preprocess in ("canonical", "both"):
        splits = {k: replace(s, params=canonicalize_params(s.params, spec)) for k, s in splits.items()}
    if preprocess in ("standardize", "both"):
        stats = WeightStats.of(TransformerWeights.from_params(splits["train"].params, spec))
        splits = {k: replace(s, params=stats.apply(TransformerWeights.from_params(s.params, spec)).to_params()
                             .to(s.params.dtype)) for k, s in splits.items()}
    return splits, stats


def _read_split(zoo: Zoo, split: str, where: Mapping[str, Any], target: Target) -> SplitData:
    weights = zoo.split_weights(split)
    keep = zoo.select(split, where=where)
    rows = weights.metadata.take(pa.array(keep))
    values = target.values(rows, f"{zoo.dir}/{split}") if len(keep) else np.zeros(0)
    accuracy = weights.labels()[torch.from_numpy(keep)].numpy().astype(np.float64) \
        if "test_accuracy" not in zoo.withheld(split) else np.full(len(keep), math.nan)
    return SplitData(weights.rows(keep), values, accuracy, np.asarray(rows.column("run_id").to_pylist(), dtype=object),
                     rows)


def _concat(parts: list[SplitData]) -> SplitData:
    return SplitData(torch.cat([p.params for p in parts]), np.concatenate([p.target for p in parts]),
                     np.concatenate([p.accuracy for p in parts]), np.concatenate([p.runs for p in parts]),
                     pa.concat_tables([p.metadata for p in parts]))


def _resplit(splits: dict[str, SplitData], rule: SplitRule) -> dict[str, SplitData]:
    """The checkpoints of all splits split again by `rule` (another salt, or another unit: run or family)."""
    pooled = _concat(list(splits.values()))
    columns = ["run_id", *(FAMILY_KEYS if rule.by == "family" else ())]
    assigned = np.asarray([rule.assign(row) for row in pooled.metadata.select(columns).to_pylist()], dtype=object)
    return {name: pooled.subset(assigned == name) for name in SPLIT_NAMES}


def _keep_runs(split: SplitData, share: float, seed: int) -> SplitData:
    """A seeded draw of `share` of the split's runs, every checkpoint of a kept run kept."""
    runs = sorted(set(split.runs.tolist()))
    kept = set(np.random.default_rng(seed).permutation(runs)[: max(2, round(share * len(runs)))].tolist())
    return split.subset(np.asarray([r in kept for r in split.runs.tolist()]))
