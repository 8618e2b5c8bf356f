"""How XGBoost's fit time grows with the training split, under the benchmark's tree settings and with the trees'
shape held fixed.

    python benchmarks/bench_tree_scaling.py --rows 8827 --rounds 10

`stz bench` fits XGBoost on the flattened weights (18,506 features for MNIST) with a minimum leaf weight of 50 and
at most 256 leaves. A larger training split lets each tree grow more leaves, and deeper ones, so each round costs
more than in proportion to the rows. This fits a fixed number of rounds (no early stopping) at 1/8, 1/4, 1/2 and
all of `--rows` checkpoints of a synthetic zoo with a learnable label, twice: with the benchmark's settings and
with every tree capped at 16 leaves. For each it prints the seconds per round, the leaves per tree, the mean depth
of a training row's leaf, the set-up (binning and the first round), and the growth exponent of the time against the smallest size (1 = linear).
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from xgboost.callback import TrainingCallback

from common import PROJECT  # noqa: F401  (sets up the import path)

from nfn_baselines.models.baselines import tree_model
from small_transformer_zoo.format.architecture import mnist_spec
from small_transformer_zoo.testing.labelled_weights import shifted_bias_weights

SHAPES = {"benchmark settings": {}, "16 leaves at most": {"max_leaves": 16}}


class RoundClock(TrainingCallback):
    """The time at the end of each boosting round: rounds after the first exclude the fit's set-up (binning)."""

    def __init__(self) -> None:
        super().__init__()
        self.ends: list[float] = []

    def after_iteration(self, model: object, epoch: int, evals_log: dict) -> bool:
        self.ends.append(time.perf_counter())
        return False


def leaf_shape(booster: object) -> tuple[float, float]:
    """Mean leaves per tree, and the mean depth of a training row's leaf (leaves weighted by their cover)."""
    table = booster.trees_to_dataframe()
    leaves, depth_sum, cover_sum = 0, 0.0, 0.0
    for _, tree in table.groupby("Tree"):
        depth = {f"{int(tree['Tree'].iloc[0])}-0": 0}
        for row in tree.itertuples():
            here = depth[row.ID]
            if row.Feature == "Leaf":
                leaves += 1
                depth_sum += here * row.Cover
                cover_sum += row.Cover
            else:
                depth[row.Yes] = depth[row.No] = here + 1
    return leaves / table["Tree"].nunique(), depth_sum / cover_sum


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8827, help="the largest training split (default: the paper "
                        "protocol's at the release's MNIST size)")
    parser.add_argument("--rounds", type=int, default=10, help="at least 2: the first holds the set-up")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2")
    spec = mnist_spec()
    sizes = [args.rows // 8, args.rows // 4, args.rows // 2, args.rows]
    params, labels = shifted_bias_weights(spec, args.rows, 0)
    x, y = params.numpy(), labels.numpy()
    print(f"{spec.n_params} features, {args.rounds} rounds, 1 thread, rows {sizes}")
    print(f"  {'trees':<20} {'rows':>6} {'set-up s':>9} {'s/round':>8} {'leaves':>7} {'row depth':>10} {'s/(row x depth)':>16}"
          f" {'growth':>7}")
    for label, shape in SHAPES.items():
        first: tuple[int, float] | None = None
        for rows in sizes:
            model = tree_model("xgboost", seed=0, n_estimators=args.rounds)
            clock = RoundClock()
            model.set_params(early_stopping_rounds=None, callbacks=[clock], **shape)
            start = time.perf_counter()
            model.fit(x[:rows], y[:rows], verbose=False)
            set_up = clock.ends[0] - start
            per_round = (clock.ends[-1] - clock.ends[0]) / (args.rounds - 1)
            leaves, depth = leaf_shape(model.get_booster())
            first = first or (rows, per_round)
            growth = "-" if rows == first[0] else f"{math.log(per_round / first[1]) / math.log(rows / first[0]):.2f}"
            print(f"  {label:<20} {rows:>6} {set_up:>9.2f} {per_round:>8.3f} {leaves:>7.1f} {depth:>10.2f}"
                  f" {per_round / (rows * depth) * 1e6:>13.2f} us {growth:>7}", flush=True)


if __name__ == "__main__":
    np.random.seed(0)
    main()
