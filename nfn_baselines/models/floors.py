"""Reference rows of every benchmark table (`predictors`, kind "floor"): what a prediction needs no weights, or no
learning, to reach.

- `l2_norm`: the L2 norm of all of a checkpoint's weights, no training; its sign (larger norm, larger target or
  smaller) is chosen on the training split.
- `epoch`: the checkpoint's epoch, signed the same way.
- `hyperparameters`: LightGBM with the paper's tree settings on the run's hyperparameters (optimizer, log learning
  rate, dropout, init std, log L2, train fraction) and the checkpoint's epoch and best flag; the target's own
  columns are left out (a model of the learning rate does not see it).
- `nearest_run`: the target of the training checkpoint nearest in weight space (the distance between weight
  directions, as the clone census measures it; one matmul over the training split), no learning. On a zoo whose
  test runs have near-clones in training it scores near 1; on a zoo of independent runs it shows how far
  memorising goes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from small_transformer_zoo.format.metadata import HYPERPARAMETERS, OPTIMIZERS
from small_transformer_zoo.store.census import directions

from .fitting import FitRequest
from .metrics import kendall_tau

HYPERPARAMETER_FEATURES = (*HYPERPARAMETERS, "epoch", "is_best")


class SignedFeature:
    """One number per checkpoint, multiplied by the sign that ranks the training split best."""

    def __init__(self, feature: Any, sign: float) -> None:
        self.feature, self.sign = feature, sign

    def predict(self, split: Any) -> np.ndarray:
        return self.sign * self.feature(split)


def l2_norm(split: Any) -> np.ndarray:
    return split.params.double().norm(dim=1).numpy()


def epoch(split: Any) -> np.ndarray:
    return split.metadata.column("epoch").to_numpy(zero_copy_only=False).astype(np.float64)


def hyperparameter_table(split: Any, leave_out: tuple[str, ...]) -> np.ndarray:
    """[checkpoints, features] of the metadata (NaN where unknown): the optimizer one-hot, learning rate and L2 on
    a log scale."""
    table, columns = split.metadata, []
    for name in (c for c in HYPERPARAMETER_FEATURES if c not in leave_out):
        values = table.column(name).to_pylist()
        if name == "optimizer":
            columns += [[np.nan if v is None else float(v == o) for v in values] for o in OPTIMIZERS]
        elif name in ("learning_rate", "l2"):
            columns.append([np.nan if v is None or v <= 0 else np.log10(v) for v in values])
        else:
            columns.append([np.nan if v is None else float(v) for v in values])
    return np.asarray(columns, dtype=np.float64).T.reshape(len(split), -1)


class NearestRun:
    """Predicts the target of the training checkpoint whose weights point the nearest way (the distance between
    directions, `|w/|w| - w'/|w'||`, that the clone census uses; a class target: that checkpoint's class, as a
    one-hot row). By Euclidean distance a network unrelated to every training one would be nearest to whichever
    training network collapsed to the smallest norm; directions favour no norm. Distances are computed in float64
    on blocks of rows, so its memory stays bounded: the training split is kept as stored, never widened whole
    (44,000 checkpoints of the authors' release would be 6.5 GB in float64)."""

    QUERY_CHUNK = 1024  # rows asked about per block
    TRAIN_CHUNK = 2048  # training rows per block: at most [TRAIN_CHUNK, weights] float64 at a time

    def __init__(self, train: Any, classes: int = 0) -> None:
        self.train, self.params = train, train.params
        self.target, self.classes = np.asarray(train.target), classes

    def nearest(self, params: torch.Tensor) -> np.ndarray:
        """Index of the training row nearest in direction to each row of `params` (the first one on a tie)."""
        best = torch.full((len(params),), -float("inf"), dtype=torch.float64)
        index = torch.zeros(len(params), dtype=torch.int64)
        for start in range(0, len(self.params), self.TRAIN_CHUNK):
            block = directions(self.params[start:start + self.TRAIN_CHUNK])
            for first in range(0, len(params), self.QUERY_CHUNK):
                rows = slice(first, first + self.QUERY_CHUNK)
                cosine = directions(params[rows]) @ block.T   # the nearest direction has the largest cosine
                where = cosine.argmax(1)
                value = cosine.gather(1, where[:, None])[:, 0]
                better = value > best[rows]  # strictly: an earlier block keeps a tie
                best[rows] = torch.where(better, value, best[rows])
                index[rows] = torch.where(better, where + start, index[rows])
        return index.numpy()

    def predict(self, split: Any) -> np.ndarray:
        """The nearest training checkpoint's target; on the training split itself, each row's own (distance 0),
        without the quadratic search: at the release's size that search alone is 10^14 operations."""
        found = self.target if split is self.train else self.target[self.nearest(split.params)]
        if not self.classes:
            return found.astype(np.float64)
        return np.eye(self.classes)[found.astype(int)]


def fit_floor(name: str, request: FitRequest) -> Any:
    if name in ("l2_norm", "epoch"):
        if request.target.kind == "classification":
            raise ValueError(f"the {name} floor ranks; it does not classify {request.target.name!r}")
        feature = l2_norm if name == "l2_norm" else epoch
        tau = kendall_tau(feature(request.train), request.train.target)
        return SignedFeature(feature, -1.0 if np.isfinite(tau) and tau < 0 else 1.0)
    if name == "hyperparameters":
        from .baselines import fit_tree, tree_model

        leave_out = request.target.columns
        model = tree_model("lightgbm", request.seed, n_jobs=request.n_jobs,
                           classification=request.target.kind == "classification")
        return fit_tree(model, "lightgbm", request.train, request.validation,
                        lambda split: hyperparameter_table(split, leave_out), len(request.target.classes))
    if name == "nearest_run":
        classes = len(request.target.classes) if request.target.kind == "classification" else 0
        return NearestRun(request.train, classes)
    raise ValueError(f"unknown floor {name!r}")
