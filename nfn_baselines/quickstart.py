"""`stz quickstart`: the README's main job on the embedded default, end to end.

Builds the MNIST zoo of a preset from the embedded data (reused when already built), finds it again by its short
name with no network, trains Transformer-NFN to predict test accuracy from weights, prints Kendall's tau by
accuracy threshold with R^2 and L1, and plots the zoo's accuracy histogram.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from small_transformer_zoo import Zoo, load_dataset
from small_transformer_zoo.plots import plot_accuracy_histogram

from .metrics import DEFAULT_THRESHOLDS, scores
from .model import TransformerNFN, count_parameters
from .train import TrainConfig, predict, train_predictor


def _header(text: str) -> None:
    print(f"\n== {text}", flush=True)


def format_scores(name: str, result: dict) -> str:
    cells = [f"{result['tau']:.3f}"] + [f"{result[f'tau@{t:g}']:.3f}" for t in DEFAULT_THRESHOLDS]
    return f"  {name:<18}" + "".join(f"{c:>9}" for c in cells) + f"{result['r2']:>9.3f}{result['l1']:>9.3f}"


def score_header() -> str:
    return f"  {'model':<18}{'tau':>9}" + "".join(f"{f'>={t:g}':>9}" for t in DEFAULT_THRESHOLDS) + \
        f"{'R^2':>9}{'L1':>9}"


def run_quickstart(out: Path, preset: str, epochs: int, seed: int = 0) -> int:
    from builders.build import config_name, run_build

    config = config_name("mnist", preset)
    _header(f"1. build the {preset} MNIST zoo from the embedded data into {out}/{config}")
    run_build("mnist", preset, out)

    _header(f"2. load_dataset('small-transformer-zoo', '{config}'): found offline by name")
    splits = load_dataset("small-transformer-zoo", config)
    for name, split in splits.items():
        print(f"   {name:<11}{split.num_rows:>6} checkpoints of {split.features['params'].length:,} parameters")

    _header(f"3. Transformer-NFN predicts test accuracy from the weights ({epochs} epochs, seed {seed})")
    zoo = Zoo.open(out, config)
    data = {}
    for split in ("train", "validation", "test"):
        weights = zoo.split_weights(split)
        keep = zoo.select(split)
        data[split] = (weights.rows(keep), weights.labels()[torch.from_numpy(keep)])
    torch.manual_seed(seed)
    model = TransformerNFN(zoo.spec)
    print(f"   {count_parameters(model):,} parameters; train {len(data['train'][1])}, validation "
          f"{len(data['validation'][1])}, test {len(data['test'][1])} checkpoints (diverged runs left out)")
    bar = tqdm(total=epochs, desc="   NFN epochs", unit="epoch", file=sys.stderr)
    result = train_predictor(model, zoo.spec, data["train"], data["validation"],
                             TrainConfig(epochs=epochs, warmup_epochs=max(1, epochs // 10), seed=seed),
                             progress=lambda record: (bar.update(1), bar.set_postfix(val_tau=f"{record['validation_tau']:.3f}")))
    bar.close()
    predicted = predict(result.model, data["test"][0], zoo.spec)
    table = scores(predicted, data["test"][1].numpy())
    print(f"\n   Kendall's tau on the test split (all checkpoints, then true accuracy >= threshold), R^2, L1;"
          f" best epoch {result.best_epoch} by validation tau")
    print(score_header())
    print(format_scores("Transformer-NFN", table))
    counts = ", ".join(f">={t:g}: {table[f'n@{t:g}']}" for t in DEFAULT_THRESHOLDS)
    print(f"   test checkpoints: all {table['n']}, {counts}")

    _header("4. plots")
    path = plot_accuracy_histogram(zoo, out / "plots" / f"{config}-accuracy-histogram.png")
    print(f"   accuracy histogram per checkpoint epoch: {path}")
    spread = np.asarray([r for s in zoo.splits for r in zoo.metadata(s).column("test_accuracy").to_pylist()])
    print(f"   test accuracy across the zoo: min {spread.min():.3f}, median {np.median(spread):.3f}, "
          f"max {spread.max():.3f}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("quickstart", help="the README's main job: build, load, learn from and plot a zoo")
    parser.add_argument("--out", type=Path, default=Path("stz-out"), help="zoo root (default ./stz-out)")
    parser.add_argument("--preset", default="mini", choices=("tiny", "mini"))
    parser.add_argument("--epochs", type=int, default=30, help="Transformer-NFN training epochs")
    parser.set_defaults(func=lambda args: run_quickstart(args.out, args.preset, args.epochs))
