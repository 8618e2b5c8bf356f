"""Two builds of one plan in two precisions (fp32 and bf16), compared run by run: how far apart the same runs' test
accuracies end.

    python benchmarks/compare_precisions.py ROOT_FP32 ROOT_BF16 --config mnist-mini

Printed: the runs compared, the mean absolute difference of the last epoch's test accuracy with its 95% interval
from 1,000 bootstrap resamples of the runs, the largest difference, and each build's median accuracy.
"""

from __future__ import annotations

import argparse

import numpy as np

from common import PROJECT  # noqa: F401  (sets up the import path)

from small_transformer_zoo import Zoo


def last_epoch_accuracy(root: str, config: str) -> dict[str, float]:
    """Run id -> test accuracy of its last stored epoch."""
    zoo = Zoo.open(root, config)
    rows = [r for s in zoo.splits for r in zoo.metadata(s).to_pylist() if not r["is_best"]]
    last = max(r["epoch"] for r in rows)
    return {r["run_id"]: r["test_accuracy"] for r in rows if r["epoch"] == last}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("fp32")
    parser.add_argument("bf16")
    parser.add_argument("--config", required=True)
    args = parser.parse_args()
    a, b = last_epoch_accuracy(args.fp32, args.config), last_epoch_accuracy(args.bf16, args.config)
    runs = sorted(set(a) & set(b))
    difference = np.abs(np.array([b[r] - a[r] for r in runs]))
    rng = np.random.default_rng(0)
    means = [difference[rng.integers(0, len(runs), len(runs))].mean() for _ in range(1000)]
    low, high = np.percentile(means, [2.5, 97.5])
    print(f"{len(runs)} runs in both builds of {args.config}: mean |test accuracy bf16 - fp32| at the last epoch "
          f"{difference.mean():.4f} [{low:.4f}, {high:.4f}], largest {difference.max():.4f}; median accuracy fp32 "
          f"{np.median([a[r] for r in runs]):.3f}, bf16 {np.median([b[r] for r in runs]):.3f}")


if __name__ == "__main__":
    main()
