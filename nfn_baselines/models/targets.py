"""What the benchmark predicts from a checkpoint's weights: its test accuracy (the paper's target) or another
quantity the zoo records (docs/design.md section 10).

A target says how its value is read from the metadata, whether it is a regression (scored by Kendall's tau, R^2
and L1) or a classification (scored by accuracy and macro-F1), and how a neural model's head and loss fit it:
accuracies in [0, 1] through a sigmoid and binary cross-entropy, other numbers standardised with the training
split's mean and deviation and fitted by squared error, classes by cross-entropy. The data, splits and protocol do
not change with the target.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pyarrow as pa

from small_transformer_zoo.errors import DataError
from small_transformer_zoo.format.metadata import OPTIMIZERS


@dataclass(frozen=True)
class Target:
    name: str
    kind: Literal["regression", "classification"]
    description: str
    columns: tuple[str, ...]                       # metadata columns the value is computed from
    value: Callable[[pa.Table], np.ndarray]        # float values, or class indices for a classification
    loss: Literal["bce", "mse", "ce"]              # how a neural model is fitted
    classes: tuple[str, ...] = ()
    bounds: tuple[float, float] = (-math.inf, math.inf)  # where a prediction may lie (a submission outside: refused)

    @property
    def outputs(self) -> int:
        """Outputs of a neural model's head."""
        return len(self.classes) if self.kind == "classification" else 1

    @property
    def submission_column(self) -> str:
        """A submission's column: `predicted_<target>`, `predicted_accuracy` for the default target."""
        return "predicted_accuracy" if self.name == "test_accuracy" else f"predicted_{self.name}"

    def values(self, table: pa.Table, where: str) -> np.ndarray:
        """The target of every row of `table`; a clear error when the zoo does not record it."""
        for column in self.columns:
            data = table.column(column)
            if data.null_count:
                raise DataError(f"{where}: the zoo does not record {column!r} for {data.null_count} of its "
                                f"{table.num_rows} checkpoints, so it has no target {self.name!r} "
                                f"({self.description})")
        return self.value(table)


def _column(name: str) -> Callable[[pa.Table], np.ndarray]:
    return lambda table: table.column(name).to_numpy(zero_copy_only=False).astype(np.float64)


def _gap(table: pa.Table) -> np.ndarray:
    return _column("train_accuracy")(table) - _column("test_accuracy")(table)


def _epoch(table: pa.Table) -> np.ndarray:
    epochs = _column("epoch")(table)
    if (epochs < 0).any():
        raise DataError(f"{int((epochs < 0).sum())} checkpoints have no known epoch (an imported release's best "
                        f"checkpoints, epoch -1); leave them out with where={{'is_best': False}}")
    return epochs


def _log_learning_rate(table: pa.Table) -> np.ndarray:
    return np.log10(_column("learning_rate")(table))


def _optimizer(table: pa.Table) -> np.ndarray:
    names = table.column("optimizer").to_pylist()
    unknown = sorted(set(names) - set(OPTIMIZERS))
    if unknown:
        raise DataError(f"optimizer values {unknown[:3]} are not among {list(OPTIMIZERS)}")
    return np.asarray([OPTIMIZERS.index(n) for n in names], dtype=np.int64)


TARGETS = {t.name: t for t in (
    Target("test_accuracy", "regression", "accuracy on the task's test set", ("test_accuracy",),
           _column("test_accuracy"), "bce", bounds=(0.0, 1.0)),
    Target("generalization_gap", "regression", "train accuracy minus test accuracy",
           ("train_accuracy", "test_accuracy"), _gap, "mse", bounds=(-1.0, 1.0)),
    Target("test_loss", "regression", "mean cross-entropy on the test set", ("test_loss",), _column("test_loss"),
           "mse", bounds=(0.0, math.inf)),
    Target("learning_rate", "regression", "the run's peak learning rate, on a log scale", ("learning_rate",),
           _log_learning_rate, "mse"),
    Target("epoch", "regression", "the epoch after which the checkpoint was saved", ("epoch",), _epoch,
           "mse"),
    Target("optimizer", "classification", "the run's optimizer (one of four classes)", ("optimizer",), _optimizer,
           "ce", OPTIMIZERS),
)}


def get_target(name: str) -> Target:
    if name not in TARGETS:
        raise ValueError(f"unknown target {name!r}; targets are {list(TARGETS)}")
    return TARGETS[name]
