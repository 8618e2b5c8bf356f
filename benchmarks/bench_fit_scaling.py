"""How the benchmark's fits grow with the training split: XGBoost's time per boosting round and its memory, one
training epoch of a neural model, and the `nearest_run` floor's search.

    python benchmarks/bench_fit_scaling.py --rows 8827 --models xgboost --rounds 6
    python benchmarks/bench_fit_scaling.py --rows 44000 --models statnn
    python benchmarks/bench_fit_scaling.py --rows 44000 --models transformer_nfn
    python benchmarks/bench_fit_scaling.py --rows 22000 --models nearest_run
    python benchmarks/bench_fit_scaling.py --rows 44000 --models xgboost_memory --validation-rows 9400

The data are synthetic checkpoints of the MNIST architecture (18,506 weights) with a learnable label.

XGBoost (`xgboost`): `stz bench` fits it on the flattened weights with a minimum leaf weight of 50 and at most 256
leaves, so a larger training split grows larger trees. This fits `--rounds` rounds (no early stopping) at 1/8, 1/4,
1/2 and all of `--rows`, twice: with the benchmark's settings and with every tree capped at 16 leaves. It prints the
set-up (binning and the first round), the seconds per later round, the leaves per tree, the mean depth of a
training row's leaf, and the growth exponent of the time per round against the smallest size (1 = linear).

A neural model (`statnn`, `transformer_nfn`, `mlp`): one epoch at 1/8 and all of `--rows`, twice, interleaved, so
that a load that changes during the run weighs on both sizes; it prints the time per checkpoint and its ratio.

The `nearest_run` floor: the exact nearest training checkpoint of each of `--rows` / 2 queries (about the
all-checkpoints protocol's validation and test splits against its training split), at 1/8 and all of `--rows`:
an exhaustive search, so its time grows with the square of the size.

`xgboost_memory`: the peak memory XGBoost adds to its input arrays when fitted as `stz bench` fits it (2 rounds,
with `--validation-rows` checkpoints as its evaluation set), on all of `--rows` (the kernel's VmHWM, reset once
the arrays are made; Linux only).
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from xgboost.callback import TrainingCallback

from common import PROJECT  # noqa: F401  (sets up the import path)

from nfn_baselines.models.baselines import tree_model
from nfn_baselines.models.floors import NearestRun
from nfn_baselines.models.predictors import get_predictor
from nfn_baselines.models.train import TrainConfig, train_predictor
from small_transformer_zoo.format.architecture import mnist_spec
from small_transformer_zoo.testing.labelled_weights import shifted_bias_weights

SPEC = mnist_spec()
SHAPES = {"benchmark settings": {}, "16 leaves at most": {"max_leaves": 16}}


def growth(size: int, cost: float, first: tuple[int, float]) -> str:
    """log(cost ratio) / log(size ratio) against the first (size, cost) measured: 1 is linear."""
    if size == first[0]:
        return "-"
    return f"{math.log(cost / first[1]) / math.log(size / first[0]):.2f}"


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


def xgboost_rounds(x: torch.Tensor, y: torch.Tensor, rounds: int) -> None:
    sizes = [len(x) // 8, len(x) // 4, len(x) // 2, len(x)]
    print(f"XGBoost: {rounds} rounds, 1 thread, rows {sizes}")
    print(f"  {'trees':<20} {'rows':>6} {'set-up s':>9} {'s/round':>8} {'leaves':>7} {'row depth':>10}"
          f" {'s/(row x depth)':>16} {'growth':>7}")
    for label, shape in SHAPES.items():
        first: tuple[int, float] | None = None
        for rows in sizes:
            clock = RoundClock()
            model = tree_model("xgboost", seed=0, n_estimators=rounds)
            model.set_params(early_stopping_rounds=None, callbacks=[clock], **shape)
            start = time.perf_counter()
            model.fit(x[:rows].numpy(), y[:rows].numpy(), verbose=False)
            set_up = clock.ends[0] - start
            per_round = (clock.ends[-1] - clock.ends[0]) / (rounds - 1)
            leaves, depth = leaf_shape(model.get_booster())
            first = first or (rows, per_round)
            per_row_level = f"{per_round / (rows * depth) * 1e6:>13.2f} us" if depth else f"{'-':>16}"
            print(f"  {label:<20} {rows:>6} {set_up:>9.2f} {per_round:>8.3f} {leaves:>7.1f} {depth:>10.2f}"
                  f" {per_row_level} {growth(rows, per_round, first):>7}", flush=True)


def neural_epochs(name: str, x: torch.Tensor, y: torch.Tensor, validation_rows: int) -> None:
    predictor = get_predictor(name)
    validation = shifted_bias_weights(SPEC, validation_rows, 1)
    small, large = len(x) // 8, len(x)
    print(f"{name}: one epoch (batch {TrainConfig().batch_size}, {validation_rows} validation checkpoints), "
          f"{torch.get_num_threads()} threads, at {small} and {large} training checkpoints")
    per_checkpoint: dict[int, list[float]] = {small: [], large: []}
    for _ in range(2):
        for rows in (small, large):
            torch.manual_seed(0)
            net = predictor.build(SPEC, dict(predictor.settings), 1)
            start = time.perf_counter()
            train_predictor(net, SPEC, (x[:rows], y[:rows]), validation, TrainConfig(epochs=1, warmup_epochs=0))
            seconds = time.perf_counter() - start
            per_checkpoint[rows].append(seconds / rows)
            print(f"  {rows:>6} checkpoints {seconds:8.2f} s  {seconds / rows * 1e3:.3f} ms per checkpoint",
                  flush=True)
    ratio = min(per_checkpoint[large]) / min(per_checkpoint[small])
    print(f"  per checkpoint, best of two: {ratio:.2f}x at {large} against {small} (1 = linear; growth "
          f"{growth(large, ratio * large, (small, small))})")


def nearest_run_search(x: torch.Tensor, y: torch.Tensor) -> None:
    print(f"nearest_run: exact search, float64 blocks of {NearestRun.TRAIN_CHUNK} training rows, "
          f"{torch.get_num_threads()} threads")
    first: tuple[int, float] | None = None
    for rows in (len(x) // 8, len(x)):
        train, queries = SimpleNamespace(params=x[:rows], target=y[:rows].numpy()), x[: rows // 2]
        floor = NearestRun(train)
        start = time.perf_counter()
        floor.predict(SimpleNamespace(params=queries))
        seconds = time.perf_counter() - start
        first = first or (rows, seconds)
        rate = 2 * rows * len(queries) * x.shape[1] / seconds / 1e9
        print(f"  {rows:>6} training, {len(queries):>6} queries {seconds:9.2f} s  {rate:6.1f} GFLOP/s  "
              f"growth {growth(rows, seconds, first)}", flush=True)


def _memory_gib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 2**20
    raise RuntimeError(f"/proc/self/status has no {field}")


def xgboost_memory(x: torch.Tensor, y: torch.Tensor, validation_rows: int) -> None:
    vx, vy = shifted_bias_weights(SPEC, validation_rows, 1)
    arrays = x.numpy(), y.numpy(), vx.numpy(), vy.numpy()
    before = _memory_gib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from the current RSS
    model = tree_model("xgboost", seed=0, n_estimators=2)
    model.set_params(early_stopping_rounds=None)
    start = time.perf_counter()
    model.fit(arrays[0], arrays[1], eval_set=[(arrays[2], arrays[3])], verbose=False)
    peak = _memory_gib("VmHWM")
    print(f"XGBoost, 2 rounds on {len(x)} training and {validation_rows} validation checkpoints: "
          f"{time.perf_counter() - start:.1f} s; input arrays {before:.2f} GiB (process RSS), peak during the fit "
          f"{peak:.2f} GiB: {peak - before:.2f} GiB above them", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8827, help="the largest training split (default: the paper "
                        "protocol's at the release's MNIST size; the all-checkpoints protocol's is 44,000)")
    parser.add_argument("--models", nargs="+", default=["xgboost", "statnn"],
                        choices=["xgboost", "xgboost_memory", "nearest_run", "statnn", "transformer_nfn", "mlp"])
    parser.add_argument("--validation-rows", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=6, help="XGBoost's rounds, at least 2: the first holds the "
                        "set-up")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2")
    x, y = shifted_bias_weights(SPEC, args.rows, 0)
    print(f"{SPEC.n_params} weights per checkpoint, {args.rows} synthetic checkpoints")
    for name in args.models:
        if name == "xgboost":
            xgboost_rounds(x, y, args.rounds)
        elif name == "xgboost_memory":
            xgboost_memory(x, y, args.validation_rows)
        elif name == "nearest_run":
            nearest_run_search(x, y)
        else:
            neural_epochs(name, x, y, args.validation_rows)


if __name__ == "__main__":
    main()
