"""Paired differences between two `stz bench` runs on one zoo (for example with and without `--preprocess align`),
model by model: each run's submission (its predictions averaged over seeds) is scored on the same bootstrap
resamples of the test runs, so the difference has a paired 95% interval.

    python benchmarks/compare_runs.py zoos --config mnist-families bench/align/none bench/align/align

A model's tau here is that of its seed-averaged predictions, which can differ a little from the benchmark table's
mean of per-seed taus.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import common  # noqa: F401  (puts the project on sys.path)
import numpy as np

from nfn_baselines.models.metrics import RunResamples, kendall_tau, paired_difference, percentile_interval, tau_above
from small_transformer_zoo import Zoo


def submissions(folder: Path) -> dict[str, Path]:
    """model -> its submission CSV under `folder/submissions/` (`<config>-bench[-paper]-<model>.csv`)."""
    found = {}
    for path in sorted((folder / "submissions").glob("*.csv")):
        found[path.stem.rsplit("-", 1)[-1]] = path
    return found


def predictions(path: Path, order: dict[str, int]) -> np.ndarray:
    """A submission's predicted accuracies in the test split's order; every test checkpoint must be in it."""
    import pandas as pd

    table = pd.read_csv(path)
    values = np.full(len(order), np.nan)
    for cid, value in zip(table["checkpoint_id"], table["predicted_accuracy"]):
        if cid in order:
            values[order[cid]] = value
    if np.isnan(values).any():
        raise SystemExit(f"{path}: no prediction for {int(np.isnan(values).sum())} of the {len(order)} test "
                         f"checkpoints it is compared on")
    return values


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root")
    parser.add_argument("--config", required=True)
    parser.add_argument("base", type=Path, help="the run compared against (its --out folder)")
    parser.add_argument("other", type=Path, help="the run whose difference from BASE is shown")
    parser.add_argument("--models", nargs="+", help="only these (default: every model both runs submitted)")
    args = parser.parse_args()
    base, other = submissions(args.base), submissions(args.other)
    models = args.models or [m for m in base if m in other]
    first = base[models[0]]
    import pandas as pd

    ids = pd.read_csv(first)["checkpoint_id"].tolist()
    meta = Zoo.open(args.root, args.config).metadata("test").to_pandas().set_index("checkpoint_id").loc[ids]
    order = {cid: i for i, cid in enumerate(ids)}
    true = meta["test_accuracy"].to_numpy(dtype=float)
    draws = RunResamples.of(meta["run_id"].tolist())
    metric = lambda p: draws.values(tau_above(p, true))  # noqa: E731
    print(f"{draws.runs} test runs, {draws.checkpoints} checkpoints; tau of the seed-averaged predictions, 95% "
          f"intervals from {draws.resamples} bootstrap resamples of the test runs (paired)\n")
    print(f"| model | {args.base.name} | {args.other.name} | {args.other.name} minus {args.base.name} |")
    print("|---|---|---|---|")
    for model in models:
        a, b = predictions(base[model], order), predictions(other[model], order)
        va, vb = metric(a), metric(b)
        ta, tb = kendall_tau(a, true), kendall_tau(b, true)
        diff = paired_difference(vb, va, tb, ta)
        cells = [f"{t:.3f} [{lo:.3f}, {hi:.3f}]" for t, (lo, hi) in ((ta, percentile_interval(va)),
                                                                    (tb, percentile_interval(vb)))]
        tied = ", tied" if diff["tied"] else ""
        print(f"| {model} | {cells[0]} | {cells[1]} | {diff['estimate']:+.3f} [{diff['low']:+.3f}, "
              f"{diff['high']:+.3f}]{tied} |")


if __name__ == "__main__":
    main()
