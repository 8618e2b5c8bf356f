"""What every predictor is fitted on: one split's selected checkpoints (`SplitData`) and a fit's request
(`FitRequest`). The models, the floors and the benchmark all read these two types, so they live apart from
each of them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import torch

from .targets import Target


@dataclass
class SplitData:
    """One split's selected checkpoints: packed weights, the target, test accuracy (for thresholds), run ids and
    metadata rows, all in the same order."""

    params: torch.Tensor
    target: np.ndarray
    accuracy: np.ndarray
    runs: np.ndarray
    metadata: pa.Table

    def __len__(self) -> int:
        return len(self.target)

    def subset(self, mask: np.ndarray) -> "SplitData":
        index = np.nonzero(mask)[0]
        return SplitData(self.params[torch.from_numpy(index)], self.target[index], self.accuracy[index],
                         self.runs[index], self.metadata.take(pa.array(index)))

    @property
    def run_count(self) -> int:
        return len(set(self.runs.tolist()))


@dataclass(frozen=True)
class FitRequest:
    """What a tree or floor predictor is fitted on; `progress(phase, done, total)` follows a long fit (boosting
    rounds, trees of a forest)."""

    seed: int
    n_jobs: int
    train: SplitData
    validation: SplitData
    target: Target
    settings: Mapping[str, Any]
    progress: Callable[[str, int, int], None] | None = None
