"""The benchmark's metrics (docs/design.md section 10): Kendall's tau on the whole test split and above accuracy thresholds,
R^2 and L1."""

from __future__ import annotations

import math
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


def scores(predicted: np.ndarray, true: np.ndarray, thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS) -> dict:
    """tau on all checkpoints and on those with true accuracy >= each threshold, plus R^2 and L1 (all)."""
    predicted, true = np.asarray(predicted, dtype=float), np.asarray(true, dtype=float)
    out = {"tau": kendall_tau(predicted, true), "r2": r_squared(predicted, true),
           "l1": float(np.mean(np.abs(predicted - true))) if len(true) else float("nan"), "n": int(len(true))}
    for threshold in thresholds:
        keep = true >= threshold
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
