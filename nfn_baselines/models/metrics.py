"""The benchmark's metrics (docs/design.md section 10): Kendall's tau on the whole test split and above accuracy thresholds,
R^2 and L1, and their uncertainty: 95% intervals from a bootstrap over test runs, and paired differences."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

DEFAULT_THRESHOLDS = (0.2, 0.4, 0.6, 0.8)


def kendall_tau(predicted: np.ndarray, true: np.ndarray) -> float:
    """Kendall's tau-b; NaN with fewer than two checkpoints or no variation."""
    from scipy.stats import kendalltau  # here, not at the top: scipy.stats takes 0.4 s to load

    if len(true) < 2:
        return float("nan")
    return float(kendalltau(predicted, true).statistic)


def r_squared(predicted: np.ndarray, true: np.ndarray) -> float:
    total = float(np.sum((true - true.mean()) ** 2))
    return float("nan") if total == 0 else 1.0 - float(np.sum((true - predicted) ** 2)) / total


def scores(predicted: np.ndarray, true: np.ndarray, thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS,
           accuracy: np.ndarray | None = None) -> dict:
    """tau on all checkpoints and on those whose test accuracy (`accuracy`, default: `true`, the accuracy target)
    is >= each threshold, plus R^2 and L1 (all)."""
    predicted, true = np.asarray(predicted, dtype=float), np.asarray(true, dtype=float)
    accuracy = true if accuracy is None else np.asarray(accuracy, dtype=float)
    out = {"tau": kendall_tau(predicted, true), "r2": r_squared(predicted, true),
           "l1": float(np.mean(np.abs(predicted - true))) if len(true) else float("nan"), "n": int(len(true))}
    for threshold in thresholds:
        keep = accuracy >= threshold
        out[f"tau@{threshold:g}"] = kendall_tau(predicted[keep], true[keep])
        out[f"n@{threshold:g}"] = int(keep.sum())
    return out


def defined(value: Any) -> Any:
    """`value` with every NaN or infinite float replaced by None (nested dicts and lists too), for strict JSON:
    a metric that is not defined (tau of fewer than two checkpoints) is null, never the non-standard `NaN`."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: defined(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [defined(v) for v in value]
    return value


BOOTSTRAP_RESAMPLES = 1000
BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95


@dataclass(frozen=True)
class RunResamples:
    """Bootstrap resamples of a test split by run: each resample draws as many runs as the split holds, with
    replacement, and takes every checkpoint of each drawn run (a run's checkpoints are one unit: they are not
    independent). `indices[r]` are the checkpoint positions of resample r; the draws depend only on the runs and
    `seed`, so every model scored on the same split is scored on the same resamples (paired comparisons)."""

    runs: int
    checkpoints: int
    indices: tuple[np.ndarray, ...]
    seed: int

    @classmethod
    def of(cls, run_ids: Sequence[str], resamples: int = BOOTSTRAP_RESAMPLES,
           seed: int = BOOTSTRAP_SEED) -> "RunResamples":
        labels, inverse = np.unique(np.asarray(run_ids, dtype=object), return_inverse=True)
        members = [np.nonzero(inverse == k)[0] for k in range(len(labels))]
        rng = np.random.default_rng(seed)
        draws = rng.integers(0, len(labels), size=(resamples, len(labels))) if len(labels) else \
            np.zeros((resamples, 0), dtype=np.int64)
        indices = tuple(np.concatenate([members[k] for k in row]) if len(row) else np.zeros(0, dtype=np.int64)
                        for row in draws)
        return cls(len(labels), len(run_ids), indices, seed)

    @property
    def resamples(self) -> int:
        return len(self.indices)

    def values(self, metric: Callable[[np.ndarray], float]) -> np.ndarray:
        """`metric(indices)` on every resample (NaN where it is not defined there)."""
        return np.asarray([metric(index) for index in self.indices], dtype=float)


def tau_above(predicted: np.ndarray, true: np.ndarray, threshold: float | None = None
              ) -> Callable[[np.ndarray], float]:
    """Kendall's tau of the checkpoints `index` picks, those with true accuracy >= `threshold` among them."""
    def metric(index: np.ndarray) -> float:
        if threshold is not None:
            index = index[true[index] >= threshold]
        return kendall_tau(predicted[index], true[index])
    return metric


def percentile_interval(values: np.ndarray) -> tuple[float, float]:
    """The central `CONFIDENCE` interval of bootstrap values; NaN when over 5% of the resamples leave the metric
    undefined (too few checkpoints above a threshold), since the interval would then describe other splits."""
    finite = values[np.isfinite(values)]
    if not finite.size or finite.size < 0.95 * values.size:
        return float("nan"), float("nan")
    tail = (1 - CONFIDENCE) / 2 * 100
    low, high = np.percentile(finite, [tail, 100 - tail])
    return float(low), float(high)


def bootstrap_tau(predicted: np.ndarray, true: np.ndarray, run_ids: Sequence[str], threshold: float | None = None,
                  resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict[str, float]:
    """Kendall's tau on the split (above `threshold`) with its 95% interval from a bootstrap over runs, and how many
    runs and checkpoints it rests on."""
    predicted, true = np.asarray(predicted, dtype=float), np.asarray(true, dtype=float)
    draws = RunResamples.of(run_ids, resamples, seed)
    metric = tau_above(predicted, true, threshold)
    low, high = percentile_interval(draws.values(metric))
    kept = np.ones(len(true), dtype=bool) if threshold is None else true >= threshold
    return {"estimate": metric(np.arange(len(true))), "low": low, "high": high,
            "runs": len(set(np.asarray(run_ids, dtype=object)[kept])), "checkpoints": int(kept.sum())}


def paired_difference(values_a: np.ndarray, values_b: np.ndarray, estimate_a: float,
                      estimate_b: float) -> dict[str, Any]:
    """The difference a - b of one metric of two models scored on the same resamples, with its 95% interval;
    `tied` when both estimates are defined and the interval holds 0. Where the interval is undefined, the two are
    neither tied nor apart: `tied` is false and `decided` too (shown as "n/a")."""
    low, high = percentile_interval(np.asarray(values_a) - np.asarray(values_b))
    decided = math.isfinite(estimate_a) and math.isfinite(estimate_b) and math.isfinite(low) and math.isfinite(high)
    return {"estimate": estimate_a - estimate_b, "low": low, "high": high, "decided": decided,
            "tied": decided and low <= 0 <= high}


MIN_RUNS = 10  # a figure resting on fewer test runs is shown as "too few runs (n)": its interval would mean nothing


def too_few_runs(runs: int) -> bool:
    """The one rule for every output (`stz bench`, `stz score`, the leaderboards): a figure needs `MIN_RUNS` runs."""
    return runs < MIN_RUNS


def runs_behind(run_ids: np.ndarray, accuracy: np.ndarray, column: str) -> int:
    """The test runs a column rests on: for `tau@T`, the runs with a checkpoint at or above T; else all."""
    kept = accuracy >= float(column[4:]) if column.startswith("tau@") else np.ones(len(run_ids), dtype=bool)
    return len(set(np.asarray(run_ids, dtype=object)[kept].tolist()))
