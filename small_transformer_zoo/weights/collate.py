"""Batches of zoo rows for a `DataLoader`: weights in the NFN layout, optionally in canonical form and
standardised, with their labels and checkpoint ids."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..format.architecture import ArchitectureSpec
from .canonical import canonicalize
from .weight_space import TransformerWeights


@dataclass
class WeightSpaceBatch:
    """What `WeightSpaceCollator` hands a training loop: weights, labels and which checkpoints they are."""

    weights: TransformerWeights
    labels: torch.Tensor
    checkpoint_ids: list[str]


class WeightSpaceCollator:
    """`collate_fn` for a `DataLoader` over zoo rows (a `datasets` split or `WeightSpaceDataset`).

    Each row is a mapping with `params` (packed weights), the label column and `checkpoint_id`.
    """

    def __init__(self, spec: ArchitectureSpec, label: str | None = "test_accuracy",
                 dtype: torch.dtype = torch.float32, *, canonical: bool = False, standardize: Any = None):
        """`label=None` collates weights only (labels NaN), as for a leaderboard's test split whose labels are
        withheld; `canonical`: each checkpoint in its canonical form (`small_transformer_zoo.weights.canonical`);
        `standardize`: a `small_transformer_zoo.weights.standardize.WeightStats` applied after it (compute it on the same
        form)."""
        self.spec, self.label, self.dtype = spec, label, dtype
        self.canonical, self.standardize = canonical, standardize

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> WeightSpaceBatch:
        params = torch.stack([torch.as_tensor(row["params"]) for row in rows]).to(self.dtype)
        labels = torch.tensor([self._label(row) for row in rows], dtype=self.dtype)
        weights = TransformerWeights.from_params(params, self.spec)
        if self.canonical:
            weights = canonicalize(weights)
        if self.standardize is not None:
            weights = self.standardize.apply(weights)
        return WeightSpaceBatch(weights, labels, [str(row["checkpoint_id"]) for row in rows])

    def _label(self, row: Mapping[str, Any]) -> float:
        if self.label is None:
            return math.nan
        value = row.get(self.label)
        if value is None:
            raise ValueError(f"checkpoint {row.get('checkpoint_id')!r} has no {self.label} (withheld or diverged); "
                             f"collate with label=None for weights only")
        return float(value)

