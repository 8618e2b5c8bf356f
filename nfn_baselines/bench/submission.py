"""A submission file as the leaderboard's scorer reads it: one row per checkpoint id with the predicted value."""

from __future__ import annotations

import csv
import os
from pathlib import Path

import numpy as np


def write_submission(path: str | os.PathLike[str], ids: list[str], predicted: np.ndarray,
                     column: str = "predicted_accuracy") -> Path:
    """A submission CSV, as our own models hand theirs to the scorer (numbers, or class names)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("checkpoint_id", column))
        writer.writerows(zip(ids, (v if isinstance(v, str) else f"{v:.8g}" for v in predicted)))
    return path
