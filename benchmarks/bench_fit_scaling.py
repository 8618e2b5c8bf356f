"""How the benchmark's fits grow with the training split: XGBoost's time per boosting round and its memory, one
training epoch of a neural model, and the `nearest_run` floor's search.

    python benchmarks/bench_fit_scaling.py --rows 8827 --models xgboost --rounds 6
    python benchmarks/bench_fit_scaling.py --rows 44000 --models statnn
    python benchmarks/bench_fit_scaling.py --rows 44000 --models transformer_nfn
    python benchmarks/bench_fit_scaling.py --rows 22000 --models nearest_run
    python benchmarks/bench_fit_scaling.py --rows 44000 --models xgboost_memory --validation-rows 9400
    python benchmarks/bench_fit_scaling.py --rows 4000 --models xgboost_sketch --sketch-limit 1024 --rounds 50 \
        --validation-rows 1000

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
the arrays are made; Linux only), against the same fit with XGBoost's own sketch of every training row; each fit in
its own process.

`xgboost_sketch`: whether finding the bin boundaries on `--sketch-limit` training rows costs accuracy: `--rounds`
rounds on all of `--rows` with the boundaries from every row and from the sample, each scored by Kendall's tau on
`--validation-rows` fresh test checkpoints, with 95% intervals and the paired difference.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from xgboost.callback import TrainingCallback

from common import PROJECT  # noqa: F401  (sets up the import path)

from nfn_baselines.models.baselines import SKETCH_ROWS, sampled_sketch, tree_model
from nfn_baselines.models.metrics import RunResamples, kendall_tau, paired_difference, percentile_interval, tau_above
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


def benchmark_xgboost(sketch_limit: int, **settings: object) -> object:
    """XGBoost as `stz bench` fits it, with its bin boundaries found on at most `sketch_limit` training rows."""
    from xgboost import XGBRegressor

    params = {**tree_model("xgboost", seed=0).get_params(), **settings}
    return sampled_sketch(XGBRegressor, sketch_limit)(**params)


def xgboost_memory_one(x: torch.Tensor, y: torch.Tensor, validation_rows: int, sketch_limit: int) -> None:
    """One fit's peak memory, in this process: one JSON line."""
    vx, vy = shifted_bias_weights(SPEC, validation_rows, 1)
    arrays = x.numpy(), y.numpy(), vx.numpy(), vy.numpy()
    before = _memory_gib("VmRSS")
    Path("/proc/self/clear_refs").write_text("5")  # the peak (VmHWM) starts again from the current RSS
    model = benchmark_xgboost(sketch_limit, n_estimators=2, early_stopping_rounds=None)
    start = time.perf_counter()
    model.fit(arrays[0], arrays[1], eval_set=[(arrays[2], arrays[3])], verbose=False)
    print(json.dumps({"seconds": time.perf_counter() - start, "input": before, "peak": _memory_gib("VmHWM")}))


def xgboost_memory(rows: int, validation_rows: int) -> None:
    """The benchmark's XGBoost against XGBoost's own sketch of every row, each fitted in its own process."""
    print(f"XGBoost, 2 rounds on {rows} training and {validation_rows} validation checkpoints, each in its own "
          f"process; memory in GiB (process RSS)")
    print(f"  {'bin boundaries from':<28} {'seconds':>8} {'input':>6} {'peak':>6} {'above input':>12}")
    above: dict[str, float] = {}
    for label, limit in (("every training row", rows), (f"{min(rows, SKETCH_ROWS)} rows (the benchmark)",
                                                          SKETCH_ROWS)):
        child = subprocess.run([sys.executable, __file__, "--rows", str(rows), "--validation-rows",
                                str(validation_rows), "--memory-child", str(limit)],
                               capture_output=True, text=True, check=True)
        fit = json.loads(child.stdout.strip().splitlines()[-1])
        above[label] = fit["peak"] - fit["input"]
        print(f"  {label:<28} {fit['seconds']:>8.1f} {fit['input']:>6.2f} {fit['peak']:>6.2f} "
              f"{above[label]:>12.2f}", flush=True)
    first, second = above.values()
    print(f"  the benchmark's fit adds {second / first:.2f}x the memory of XGBoost's own sketch")


def xgboost_sketch(x: torch.Tensor, y: torch.Tensor, validation_rows: int, rounds: int, sketch_limit: int) -> None:
    """Test tau of XGBoost with bin boundaries from every training row and from `sketch_limit` of them, same rounds,
    with 95% intervals and their paired difference over 1,000 resamples of the test checkpoints."""
    vx, vy = shifted_bias_weights(SPEC, validation_rows, 1)
    tx, ty = shifted_bias_weights(SPEC, validation_rows, 2)
    true = ty.numpy().astype(float)
    draws = RunResamples.of([str(i) for i in range(len(true))], 1000, 0)
    print(f"XGBoost, {rounds} rounds on {len(x)} training checkpoints, scored on {len(true)} test checkpoints "
          f"(each its own run), 1 thread")
    scored = {}
    for label, limit in (("every training row", len(x)), (f"{min(len(x), sketch_limit)} rows", sketch_limit)):
        model = benchmark_xgboost(limit, n_estimators=rounds, early_stopping_rounds=None)
        start = time.perf_counter()
        model.fit(x.numpy(), y.numpy(), eval_set=[(vx.numpy(), vy.numpy())], verbose=False)
        predicted = model.predict(tx.numpy()).astype(float)
        values = draws.values(tau_above(predicted, true))
        scored[label] = (kendall_tau(predicted, true), values)
        low, high = percentile_interval(values)
        print(f"  bin boundaries from {label:<20} tau {scored[label][0]:.4f} [{low:.4f}, {high:.4f}]  "
              f"{time.perf_counter() - start:.1f} s", flush=True)
    (a, (ea, va)), (b, (eb, vb)) = scored.items()
    d = paired_difference(vb, va, eb, ea)
    print(f"  {b} minus {a}: {d['estimate']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"
          f"{' (tied)' if d['tied'] else ''}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=8827, help="the largest training split (default: the paper "
                        "protocol's at the release's MNIST size; the all-checkpoints protocol's is 44,000)")
    parser.add_argument("--models", nargs="+", default=["xgboost", "statnn"],
                        choices=["xgboost", "xgboost_memory", "xgboost_sketch", "nearest_run", "statnn",
                                 "transformer_nfn", "mlp"])
    parser.add_argument("--validation-rows", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=6, help="XGBoost's rounds, at least 2: the first holds the "
                        "set-up")
    parser.add_argument("--sketch-limit", type=int, default=SKETCH_ROWS, help="xgboost_sketch: the training rows "
                        f"the sampled bin boundaries come from (default {SKETCH_ROWS}, the benchmark's)")
    parser.add_argument("--memory-child", type=int, help=argparse.SUPPRESS)  # internal: one xgboost_memory fit
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2")
    if args.sketch_limit < 1:
        parser.error(f"--sketch-limit must be at least 1, got {args.sketch_limit}")
    if args.memory_child is not None:
        xgboost_memory_one(*shifted_bias_weights(SPEC, args.rows, 0), args.validation_rows, args.memory_child)
        return
    print(f"{SPEC.n_params} weights per checkpoint, {args.rows} synthetic checkpoints")
    data = shifted_bias_weights(SPEC, args.rows, 0) if set(args.models) - {"xgboost_memory"} else None
    for name in args.models:
        if name == "xgboost":
            xgboost_rounds(*data, args.rounds)
        elif name == "xgboost_memory":
            xgboost_memory(args.rows, args.validation_rows)
        elif name == "xgboost_sketch":
            xgboost_sketch(*data, args.validation_rows, args.rounds, args.sketch_limit)
        elif name == "nearest_run":
            nearest_run_search(*data)
        else:
            neural_epochs(name, *data, args.validation_rows)


if __name__ == "__main__":
    main()
