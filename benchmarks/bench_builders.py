"""Zoo training throughput (issue: zoo builders).

    python benchmarks/bench_builders.py [--runs 20] [--repeats 3]

The same runs (one optimizer group of the `mini` preset, embedded MNIST, 1,500 training samples, one epoch) are
trained by the vectorized trainer and by a plain one-model-at-a-time PyTorch loop (`ZooTransformer` +
torch.optim), at the paper's batch size (128) and at the `mini` preset's (32). Both do the same work: training,
then validation and test accuracy (epoch 1 is a checkpoint epoch). Rates are model-epochs per second. Achieved
GFLOP/s (analytic training and evaluation FLOPs / time) is compared with a large float32 matmul measured in the
same command. Each way runs `--repeats` times, interleaved, and the fastest counts (the machine is shared);
then the `paper` preset's cost is estimated from the batch-128 rate of `stz build`'s way: one
group per core, each on one thread (`builders.trainer.train_groups`).
"""

from __future__ import annotations

import argparse
import time

import torch

from common import PROJECT  # noqa: F401  (sets up the import path)

from builders.build import load_task_data, training_flops_per_sample
from builders.grid import PRESETS, full_grid, preset_runs
from builders.trainer import train_group, train_groups, train_run_plain
from small_transformer_zoo.architecture import mnist_spec


def matmul_gflops(size: int = 2048, repeat: int = 10) -> float:
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    start = time.perf_counter()
    for _ in range(repeat):
        a @ b
    return 2 * size ** 3 * repeat / (time.perf_counter() - start) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    preset = PRESETS["mini"]
    data = load_task_data("mnist", None, preset)
    spec = mnist_spec()
    runs = [r for r in preset_runs("mnist", preset) if r.optimizer == "adam"][: args.runs]
    samples = sum(round(r.train_fraction * len(data.train_y)) for r in runs)
    eval_samples = len(runs) * (len(data.validation_y) + len(data.test_y))
    flops = (samples + eval_samples / 3) * training_flops_per_sample(spec)
    print(f"{len(runs)} adam runs of the mini preset, 1 epoch, {len(data.train_y)} training samples, then "
          f"{len(data.validation_y)} validation and {len(data.test_y)} test; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    peak = matmul_gflops()
    rates = {}
    for batch_size in (128, 32):
        halves = [runs[: len(runs) // 2], runs[len(runs) // 2 :]]
        ways = {
            "plain": lambda: [train_run_plain(run, data, spec, 1, [1], batch_size) for run in runs],
            "vectorized": lambda: train_group(runs, data, spec, 1, [1], batch_size),
            "workers": lambda: list(train_groups(halves, data, spec, 1, [1], batch_size, workers=2)),
        }
        best = dict.fromkeys(ways, float("inf"))
        for _ in range(args.repeats):
            for name, way in ways.items():
                start = time.perf_counter()
                way()
                best[name] = min(best[name], time.perf_counter() - start)
        plain, vectorized, workers = best["plain"], best["vectorized"], best["workers"]
        rates[batch_size] = flops / workers
        print(f"batch {batch_size}:")
        print(f"  plain loop, one model at a time   {len(runs) / plain:6.2f} model-epochs/s  "
              f"{flops / plain / 1e9:6.1f} GFLOP/s ({flops / plain / 1e9 / peak:.1%} of matmul)")
        print(f"  vectorized group                  {len(runs) / vectorized:6.2f} model-epochs/s  "
              f"{flops / vectorized / 1e9:6.1f} GFLOP/s ({flops / vectorized / 1e9 / peak:.1%} of matmul)  "
              f"{plain / vectorized:.2f}x the plain loop")
        print(f"  2 half groups, one per core       {len(runs) / workers:6.2f} model-epochs/s  "
              f"{flops / workers / 1e9:6.1f} GFLOP/s ({flops / workers / 1e9 / peak:.1%} of matmul)  "
              f"{plain / workers:.2f}x the plain loop   (what `stz build` does)")
    print(f"float32 matmul 2048x2048            {peak:6.1f} GFLOP/s (the machine's practical limit)")

    grid = full_grid("mnist")
    train_pool = 54_000  # 60,000 MNIST training images less the 10% validation hold-out
    paper_flops = sum(round(r.train_fraction * train_pool) for r in grid) * 100 * training_flops_per_sample(spec)
    eval_flops = len(grid) * (100 * 6_000 + 5 * 10_000) * training_flops_per_sample(spec) / 3
    rate = rates[128]
    print(f"\npaper preset, one task: {len(grid):,} runs x 100 epochs, train pool {train_pool:,}, crop augmentation, "
          f"validation (6,000) every epoch, test (10,000) at 5 checkpoints")
    print(f"  {(paper_flops + eval_flops) / 1e15:.1f} PFLOP; at the batch-128 rate of one group per core measured here "
          f"({rate / 1e9:.1f} GFLOP/s) {(paper_flops + eval_flops) / rate / 86400:,.0f} days on this 2-core machine, "
          f"or {(paper_flops + eval_flops) / rate / 86400 / 100:,.1f} days on 100 such machines (--num-shards 100)")


if __name__ == "__main__":
    main()
