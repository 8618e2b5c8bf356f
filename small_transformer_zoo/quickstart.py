"""`stz quickstart`: the README's main job on the embedded default.

Until the zoo builders land, the default zoo is a synthetic one (random weights, labelled `synthetic` in its
provenance); the job writes it once, finds it again by short name offline, verifies it, and walks the three ways
in: the `datasets` split, streaming, and the memory-mapped fast path into a PyTorch DataLoader.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from .cli_helpers import print_header
from .hub import load_dataset
from .reader import WeightSpaceDataset, Zoo
from .registry import find_local_zoo
from .synthetic import write_synthetic_zoo
from .weight_space import WeightSpaceCollator

DEMO_CONFIG = "demo-synthetic"


def run_quickstart(out: Path, runs: int) -> int:
    print_header(f"1. zoo '{DEMO_CONFIG}' under {out}")
    if find_local_zoo(DEMO_CONFIG) == out.resolve():
        print("   already built here; reusing it")
    else:
        write_synthetic_zoo(out, DEMO_CONFIG, runs=runs, overwrite=True)
        print(f"   wrote {runs} synthetic runs (random weights: a format demo, not research data)")
    zoo = Zoo.open(out, DEMO_CONFIG)
    problems = zoo.verify()
    print("   verify:", "OK" if not problems else problems)

    print_header(f"2. load_dataset('small-transformer-zoo', '{DEMO_CONFIG}') (found offline by name)")
    splits = load_dataset("small-transformer-zoo", DEMO_CONFIG)
    for name, split in splits.items():
        print(f"   {name:<11}{split.num_rows:>6} checkpoints, params {split.features['params']}")
    stream = load_dataset("small-transformer-zoo", DEMO_CONFIG, split="test", streaming=True)
    first = next(iter(stream))
    print(f"   streaming: first test checkpoint {first['checkpoint_id']} (test accuracy {first['test_accuracy']:.3f})")

    print_header("3. fast path: memory-mapped train split -> DataLoader -> weight-space batches")
    weights = zoo.split_weights("train")
    loader = torch.utils.data.DataLoader(WeightSpaceDataset(weights), batch_size=16, shuffle=True,
                                         generator=torch.Generator().manual_seed(0),
                                         collate_fn=WeightSpaceCollator(zoo.spec))
    batch = next(iter(loader))
    block = batch.weights.blocks[0]
    print(f"   batch of {batch.weights.batch_size}: W_q {tuple(block.W_q.shape)}, W_o {tuple(block.W_o.shape)}, "
          f"W_A {tuple(block.W_A.shape)}, labels {tuple(batch.labels.shape)}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("quickstart", help="the README's main job: write, find, verify and load a zoo")
    parser.add_argument("--out", type=Path, default=Path("stz-out"), help="zoo root to use (default ./stz-out)")
    parser.add_argument("--runs", type=int, default=200)
    parser.set_defaults(func=lambda args: run_quickstart(args.out, args.runs))
