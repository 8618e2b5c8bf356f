"""Where one benchmark fit of each model spends its time: one seed, one condition, under cProfile.

    python benchmarks/profile_fits.py zoos --config agnews-wide --protocol paper --epochs 10

Each model is fitted as `stz bench` fits it (`run_benchmark` with one model row, one seed and no threshold, so
one fit), on the zoo's data read once. For each fit it prints the wall time, the time per training epoch of a
neural model, and the shares of the phases a fit is made of: computing the model's fixed features (`prepare`),
the forward pass, the backward pass, the optimizer step, validation every epoch, the final predictions of all
splits, and for tree and floor models the fit itself; "other" is the rest (building the model, the first call's
set-up, the benchmark's own steps). cProfile adds its overhead to every Python call, so the
shares are those of the profiled run and the total is higher than an unprofiled fit's; the last column names
the function with the most time of its own.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import scipy.stats  # noqa: F401  (imported before any profile: the first fit's validation would pay for it)
import torch

from common import PROJECT  # noqa: F401  (sets up the import path)

from nfn_baselines.bench.benchmark import run_benchmark
from nfn_baselines.bench.data import read_bench_data
from nfn_baselines.bench.request import BenchRequest
from nfn_baselines.models.predictors import default_predictors, floor_predictors
from small_transformer_zoo import open_zoo

# (phase, file suffix, function, the caller counted or None for every caller): each phase's cumulative time; the
# forward pass is counted where training calls it (validation calls it too, inside its own phase).
PHASES = (("prepare", "nfn_baselines/models/train.py", "prepare", None),
          ("forward", "nfn_baselines/models/train.py", "_forward", "run"),
          ("backward", "torch/_tensor.py", "backward", "run"),
          ("optimizer", "nfn_baselines/models/train.py", "_adam_step", None),
          ("validation", "nfn_baselines/models/train.py", "_validation_predictions", None),
          ("predict", "nfn_baselines/models/train.py", "predict_prepared", None),
          ("tree/floor fit", "nfn_baselines/bench/benchmark.py", "_fit_table_model", None))


def phase_seconds(stats: pstats.Stats) -> dict[str, float]:
    """Cumulative seconds of each phase's entry point, summed over its calls (from the named caller only)."""
    table = stats.stats  # type: ignore[attr-defined]  # {(file, line, function): (cc, nc, tt, ct, callers)}
    out = {}
    for name, suffix, entry, caller in PHASES:
        total = 0.0
        for (file, _, function), (_, _, _, cumulative, callers) in table.items():
            if file.endswith(suffix) and function == entry:
                total += cumulative if caller is None else sum(v[3] for k, v in callers.items() if k[2] == caller)
        out[name] = total
    return out


def top_own_time(stats: pstats.Stats) -> tuple[str, float]:
    """The function with the most time of its own, and that time."""
    table = stats.stats  # type: ignore[attr-defined]
    (file, line, function), values = max(table.items(), key=lambda item: item[1][2])
    where = file.split("site-packages/")[-1].split("/work/main/")[-1]
    return f"{function} ({where}:{line})", values[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root")
    parser.add_argument("--config", required=True)
    parser.add_argument("--protocol", default="paper", choices=("paper", "all-checkpoints"))
    parser.add_argument("--epochs", type=int, default=30, help="training epochs of a neural model (stz bench's)")
    parser.add_argument("--models", nargs="+", default=None, help="default: every default model and the floors")
    args = parser.parse_args()
    torch.set_num_threads(1)
    models = args.models or [*default_predictors(), *floor_predictors()]
    zoo = open_zoo(args.root, args.config)
    base = BenchRequest(models=models[:1], seeds=1, epochs=args.epochs, protocol=args.protocol, thresholds=(),
                        device="cpu")
    started = time.perf_counter()
    data = read_bench_data(zoo, base.data_selection())
    print(f"{args.config}: read in {time.perf_counter() - started:.1f} s; "
          + ", ".join(f"{k} {s.run_count} runs / {len(s)} checkpoints" for k, s in data.splits.items())
          + f"; 1 thread, 1 seed, {args.epochs} epochs for a neural model")
    header = ["model", "fit (s)", "s / epoch (epochs)", *(p[0] for p in PHASES), "other", "most own time"]
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for name in models:
        request = BenchRequest(models=[name], seeds=1, epochs=args.epochs, protocol=args.protocol, thresholds=(),
                               device="cpu")
        epochs: list[str] = []  # one entry per epoch trained (early stopping may end a fit before --epochs)
        profiler = cProfile.Profile()
        started = time.perf_counter()
        profiler.enable()
        run_benchmark(data, request, on_epoch=lambda model, condition: epochs.append(model))
        profiler.disable()
        seconds = time.perf_counter() - started
        stats = pstats.Stats(profiler)
        phases = phase_seconds(stats)
        per_epoch = f"{seconds / len(epochs):.2f} ({len(epochs)})" if epochs else "-"
        shares = [f"{100 * phases[p[0]] / seconds:.0f}%" if phases[p[0]] else "-" for p in PHASES]
        shares.append(f"{100 * (1 - sum(phases.values()) / seconds):.0f}%")
        function, own = top_own_time(stats)
        print(f"| {name} | {seconds:.1f} | {per_epoch} | " + " | ".join(shares)
              + f" | {function}, {100 * own / seconds:.0f}% |", flush=True)


if __name__ == "__main__":
    main()
