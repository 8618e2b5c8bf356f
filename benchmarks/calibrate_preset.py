"""Calibrate a build preset on a sample of the grid before building it: minutes per run and the accuracy the runs
reach at their last epoch, overall and per value of every hyperparameter.

    python benchmarks/calibrate_preset.py --runs 48 --epochs 8 --train-samples 2400 --batch-size 16
    python benchmarks/calibrate_preset.py --task agnews --data-dir DIR --carve-from-test --runs 48

The sample is `--runs` runs of the paper's grid chosen as a preset's `selection` chooses them (stratified: every
value of every hyperparameter), trained exactly as `stz build` trains (one group per core); the projected time
for a preset of `--project` runs scales the measured seconds per run.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from dataclasses import replace

import common  # noqa: F401  (puts the project on sys.path)
import numpy as np

from builders.request import load_task_data
from builders.grid import HYPER_ORDER, PRESETS, checkpoint_epochs, full_grid, groups, stratified_sample, sweep_sample
from builders.tasks import get_task
from builders.trainer import Recipe, train_groups
from small_transformer_zoo.devices import usable_cores


def summary(values: list[float]) -> str:
    array = np.asarray(values)
    return (f"min {array.min():.3f}  median {np.median(array):.3f}  90th {np.quantile(array, 0.9):.3f}  "
            f"max {array.max():.3f}  above 0.5 {100 * (array > 0.5).mean():.1f}%  "
            f"above 0.8 {100 * (array > 0.8).mean():.1f}%")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", default="mnist")
    parser.add_argument("--data-dir", help="the task's data, as for `stz build --data-dir`")
    parser.add_argument("--carve-from-test", action="store_true",
                        help="with test files only: carve train and test out of the test set, as `stz build` does")
    parser.add_argument("--base", default="wide", choices=sorted(PRESETS), help="preset whose other settings apply")
    parser.add_argument("--runs", type=int, default=48)
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--train-samples", type=int)
    parser.add_argument("--batch-size", type=int)
    parser.add_argument("--selection", choices=("stratified", "sweep"))
    parser.add_argument("--every-epoch", action="store_true",
                        help="store (and report) every epoch, to read how many epochs a share of runs needs")
    parser.add_argument("--project", type=int, default=1500, help="runs of the preset the time is projected to")
    args = parser.parse_args()
    preset = PRESETS[args.base].for_task(args.task)
    changes = {"epochs": args.epochs, "max_train_samples": args.train_samples, "batch_size": args.batch_size,
               "selection": args.selection, "every_epoch": args.every_epoch or None}
    preset = replace(preset, **{k: v for k, v in changes.items() if v is not None})
    task = get_task(args.task)
    data = load_task_data(task, args.data_dir, preset, carve_from_test=args.carve_from_test)
    spec = task.spec(data)
    pick = sweep_sample if preset.selection == "sweep" else stratified_sample
    runs = pick(full_grid(args.task), args.runs)
    workers = usable_cores()
    size = min(preset.group_size, max(1, -(-len(runs) // (4 * workers))))
    todo = groups(runs, size)
    print(f"{len(runs)} runs ({preset.selection}), {preset.epochs} epochs of {len(data.train_y)} images in batches "
          f"of {preset.batch_size}, augment {preset.augment}; {len(todo)} groups of up to {size}, {workers} workers")
    started = time.perf_counter()
    last: dict[str, float] = {}
    best: dict[str, float] = {}
    recipe = Recipe(preset.epochs, tuple(checkpoint_epochs(preset.epochs, preset.every_epoch)), preset.batch_size,
                    preset.augment)
    every: list[float] = []
    by_epoch: dict[int, list[float]] = defaultdict(list)
    for _, checkpoints, _ in train_groups(todo, data, spec, recipe, "cpu", workers):
        for c in checkpoints:
            every.append(c.metrics["test_accuracy"])
            if not c.is_best:
                by_epoch[c.epoch].append(c.metrics["test_accuracy"])
            if c.is_best or c.epoch == preset.epochs:
                (best if c.is_best else last)[c.run.run_id] = c.metrics["test_accuracy"]
    seconds = time.perf_counter() - started
    print(f"trained in {seconds / 60:.2f} min: {seconds / len(runs):.2f} s a run; {args.project} runs: "
          f"{seconds / len(runs) * args.project / 60:.0f} min")
    print(f"stored      {summary(every)} ({len(every)} checkpoints at epochs {list(recipe.checkpoint_epochs)} and "
          f"the best)")
    print(f"last epoch  {summary(list(last.values()))}")
    print(f"best epoch  {summary(list(best.values()))}")
    print("test accuracy at each stored epoch:")
    for epoch in sorted(by_epoch):
        print(f"  epoch {epoch:>3}  {summary(by_epoch[epoch])}")
    by_run = {r.run_id: r for r in runs}
    print("median last-epoch test accuracy (share above 0.5) per value:")
    for name in ("optimizer", *HYPER_ORDER):
        cells: dict[object, list[float]] = defaultdict(list)
        for run_id, accuracy in last.items():
            cells[getattr(by_run[run_id], name)].append(accuracy)
        text = "  ".join(f"{value}: {statistics.median(v):.2f} ({100 * np.mean(np.asarray(v) > 0.5):.0f}%)"
                         for value, v in sorted(cells.items(), key=lambda kv: str(kv[0])))
        print(f"  {name:<15} {text}")


if __name__ == "__main__":
    main()
