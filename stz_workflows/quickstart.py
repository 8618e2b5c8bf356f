"""`stz quickstart`: the README's main job on the embedded default, end to end.

Builds the MNIST zoo of a preset from the embedded data (reused when already built), finds it again by its short
name with no network, trains Transformer-NFN and the five baselines to predict test accuracy from weights (one
seed), prints Kendall's tau by accuracy threshold with R^2 and L1, and plots the zoo's accuracy histogram and
each model's predictions.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
from tqdm import tqdm

from builders.build import config_name, run_build
from nfn_baselines.benchmark import (load_bench_data, model_specs, plot_predictions, render_markdown, run_benchmark,
                                     summarize)
from nfn_baselines.metrics import DEFAULT_THRESHOLDS
from small_transformer_zoo import Zoo, load_dataset
from small_transformer_zoo.devices import resolve_device, usable_cores
from small_transformer_zoo.plots import plot_accuracy_histogram


def _header(text: str) -> None:
    print(f"\n== {text}", flush=True)


def run_quickstart(out: Path, preset: str, epochs: int, seed: int = 0, device: str = "auto") -> int:
    config = config_name("mnist", preset)
    _header(f"1. build the {preset} MNIST zoo from the embedded data into {out}/{config}")
    run_build("mnist", preset, out, device=device)

    _header(f"2. load_dataset('small-transformer-zoo', '{config}'): found offline by name")
    splits = load_dataset("small-transformer-zoo", config)
    for name, split in splits.items():
        print(f"   {name:<11}{split.num_rows:>6} checkpoints of {split.features['params'].length:,} parameters")

    _header(f"3. Transformer-NFN and the baselines predict test accuracy from the weights (seed {seed})")
    data = load_bench_data(out, config)
    print(f"   train {len(data.splits['train'][1])}, validation {len(data.splits['validation'][1])}, test "
          f"{len(data.splits['test'][1])} checkpoints (diverged runs left out); neural models: {epochs} epochs")
    models = model_specs()
    bar = tqdm(total=len(models), desc="   models", unit="model", file=sys.stderr)
    result = run_benchmark(data, models, [seed], epochs,
                           on_done=lambda name, _, row: (bar.update(1), bar.set_postfix_str(f"{name}: tau {row['tau']:.3f}")),
                           device=str(resolve_device(device)), n_jobs=usable_cores())
    bar.close()
    print()
    print(render_markdown(summarize(result), DEFAULT_THRESHOLDS, 1, config))
    figure = plot_predictions(result, out / "plots" / f"{config}-predicted-vs-true.png", config)

    _header("4. plots")
    zoo = Zoo.open(out, config)
    path = plot_accuracy_histogram(zoo, out / "plots" / f"{config}-accuracy-histogram.png")
    print(f"   accuracy histogram per checkpoint epoch: {path}")
    print(f"   predicted against true accuracy per model: {figure}")
    spread = np.asarray([r for s in zoo.splits for r in zoo.metadata(s).column("test_accuracy").to_pylist()])
    print(f"   test accuracy across the zoo: min {spread.min():.3f}, median {np.median(spread):.3f}, "
          f"max {spread.max():.3f}")
    return 0
