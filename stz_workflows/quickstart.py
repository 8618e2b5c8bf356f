"""`stz quickstart`: the README's main job on the embedded default, end to end.

Builds the MNIST zoo of a preset from the embedded data (reused when already built), reads it back by its path
with `load_dataset` (printing that path), trains Transformer-NFN, the baselines and the floors to predict test accuracy from weights
(one seed), prints the table with 95% intervals over test runs, and plots the zoo's accuracy histogram and each
model's predictions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from builders.build import BuildRequest, run_build
from nfn_baselines.bench.progress import BenchProgress
from nfn_baselines.bench.runs import BenchRequest, bench_store, run_bench
from small_transformer_zoo import Zoo, load_dataset
from small_transformer_zoo.devices import usable_cores
from small_transformer_zoo.plots import plot_accuracy_histogram


def _header(text: str) -> None:
    print(f"\n== {text}", flush=True)


def run_quickstart(out: Path, preset: str, epochs: int, seed: int = 0, device: str = "auto") -> int:
    request = BuildRequest.of("mnist", preset, out, device=device)
    config = request.config
    _header(f"1. build the {preset} MNIST zoo from the embedded data into {out}/{config}")
    run_build(request)

    _header(f"2. load_dataset('{out}', '{config}'): the zoo just built, read from {(out / config).resolve()}")
    splits = load_dataset(out, config)
    for name, split in splits.items():
        print(f"   {name:<11}{split.num_rows:>6} checkpoints of {split.features['params'].length:,} parameters")

    _header(f"3. Transformer-NFN, the baselines and the floors predict test accuracy from the weights (seed {seed})")
    zoo = Zoo.open(out, config)
    bench = BenchRequest(seeds=1, epochs=epochs, device=device, jobs=usable_cores())
    kept = bench_store(zoo, bench, out / "bench")
    if len(kept):
        where = kept.kept if kept.finished else kept.folder
        print(f"   reusing {len(kept)} of {bench.fit_count()} fits of an earlier run ({where})", flush=True)
    progress = BenchProgress(bench, "   models", spec=zoo.spec)
    outcome = run_bench(zoo, bench, out / "bench", progress=progress)
    progress.close()
    print()
    print(outcome.markdown)

    _header("4. plots")
    path = plot_accuracy_histogram(zoo, out / "plots" / f"{config}-accuracy-histogram.png")
    print(f"   accuracy histogram per checkpoint epoch: {path}")
    print(f"   predicted against true accuracy per model: {outcome.paths['plot']}")
    spread = np.asarray([r for s in zoo.splits for r in zoo.metadata(s).column("test_accuracy").to_pylist()])
    print(f"   test accuracy across the zoo: min {spread.min():.3f}, median {np.median(spread):.3f}, "
          f"max {spread.max():.3f}")
    return 0
