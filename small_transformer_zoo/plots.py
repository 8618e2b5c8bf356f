"""Plots of a zoo (matplotlib, imported only when a plot is made)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from .store.reader import Zoo

MAX_PANELS = 7


def new_figure(rows: int, columns: int, figsize: tuple[float, float]) -> tuple[Any, Any]:
    """A figure and its [rows, columns] axes, made without pyplot: no backend is chosen for the process and no
    figure stays registered anywhere (matplotlib is imported only here, when a plot is made)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("plots need matplotlib: pip install matplotlib (it comes with "
                          "small-transformer-zoo[baselines])") from None

    figure = Figure(figsize=figsize)
    return figure, figure.subplots(rows, columns, squeeze=False)


def save_figure(figure: Any, title: str, path: str | os.PathLike[str]) -> Path:
    """Title, lay out and write as PNG (folders made as needed)."""
    figure.suptitle(title)
    figure.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return path


def plot_accuracy_histogram(zoo: Zoo, path: str | os.PathLike[str]) -> Path:
    """Test-accuracy histogram per checkpoint epoch (and the best checkpoints), all splits: the paper's Figure 1."""
    rows = [r for split in zoo.splits for r in zoo.metadata(split).select(["epoch", "is_best", "test_accuracy",
                                                                           "diverged"]).to_pylist()]
    groups: dict[str, list[float]] = {}
    for r in rows:
        if not r["diverged"] and r["test_accuracy"] is not None:  # None: withheld in a leaderboard's public copy
            groups.setdefault("best" if r["is_best"] else f"epoch {r['epoch']}", []).append(r["test_accuracy"])
    epochs = sorted(int(g.split()[1]) for g in groups if g != "best")
    shown = epochs
    if len(epochs) > MAX_PANELS - 2:  # a checkpoint every epoch: the first, the paper's 50% and 75%, the last, all
        shown = sorted({epochs[0], *(min(epochs, key=lambda e: abs(e - f * epochs[-1])) for f in (0.5, 0.75)),
                        epochs[-1]})
        groups["all epochs"] = [a for e in epochs for a in groups[f"epoch {e}"]]
    names = [f"epoch {e}" for e in shown] + [g for g in ("all epochs", "best") if g in groups]
    figure, axes = new_figure(1, len(names), (3.2 * len(names), 3))
    bins = np.linspace(0, 1, 21)
    for axis, name in zip(axes[0], names):
        axis.hist(groups[name], bins=bins, color="tab:blue", edgecolor="white")
        axis.set_title(f"{name} (n={len(groups[name])})")
        axis.set_xlabel("test accuracy")
    axes[0][0].set_ylabel("checkpoints")
    return save_figure(figure, f"{zoo.config}: test accuracy by checkpoint epoch", path)
