"""Where one optimizer step of a builder's group spends its time on a CPU, and what two changes to it would gain.

    python benchmarks/bench_builder_step.py [--runs 10] [--steps 40] [--repeats 3]

One group of `--runs` Adam runs of the `mini` preset (batch 16, dropout on, no augmentation) on one thread, as
`stz build` trains a group on each core:

1. the step as the builder takes it (forward, loss, backward, the optimizer's update), against the same forward and
   loss compiled with `torch.compile` (the backward compiled with it by AOTAutograd; the compile's own seconds
   printed apart), both timed over `--steps` steps after warm-up, `--repeats` times interleaved, the fastest
   counting;
2. attention at the group's shapes (sequences of 49 tokens, heads of width 16): PyTorch's fused kernel against
   explicit batched matmuls and a softmax, forward and backward;
3. a profile of `--steps` steps of the builder's step: each operator's share of the CPU time, the largest first.

Ratios are against the first way, measured in the same command.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import torch
from torch.nn import functional as F

from common import PROJECT  # noqa: F401  (sets up the import path)

from builders.batched import batched_logits, packed_views
from builders.grid import PRESETS, preset_runs
from builders.request import load_task_data
from builders.tasks import get_task
from builders.trainer import EpochTotals, GroupTraining, Recipe
from small_transformer_zoo.format.architecture import mnist_spec

BATCH = 16


def group(runs: int) -> GroupTraining:
    preset = PRESETS["mini"]
    data = load_task_data(get_task("mnist"), None, preset)
    chosen = [r for r in preset_runs("mnist", PRESETS["wide"]) if r.optimizer == "adam" and r.dropout > 0][:runs]
    return GroupTraining(chosen, data, mnist_spec(), Recipe(1, (1,), BATCH, False), "cpu", None, False)


def builder_steps(training: GroupTraining, steps: int) -> Callable[[], None]:
    """`steps` of `GroupTraining.step`, the builder's own, on the epoch's first batches."""
    draws = training.streams.epoch(BATCH, False, False)
    models = len(training.runs)
    lr = torch.full((models,), 1e-3)
    active = torch.ones(models, dtype=torch.bool)

    def run() -> None:
        totals = EpochTotals(torch.zeros(models), torch.zeros(models), torch.zeros(models, dtype=torch.float64))
        for step in range(steps):
            batch = slice(step * BATCH, (step + 1) * BATCH)
            training.step(draws.order[:, batch], draws.weight[:, batch], None, None, active, lr, totals,
                          [True] * models)
    return run


def compiled_steps(training: GroupTraining, steps: int) -> tuple[Callable[[], None], float]:
    """The same steps with forward and loss compiled (the optimizer's update left as it is); the compile's seconds."""
    spec, tensors, dropout, optimizer = training.spec, training.tensors, training.dropout, training.optimizer
    draws = training.streams.epoch(BATCH, False, False)
    models = len(training.runs)
    lr = torch.full((models,), 1e-3)
    active = torch.ones(models, dtype=torch.bool)

    def loss(packed: torch.Tensor, inputs: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        logits = batched_logits(spec, packed_views(spec, packed), inputs, training.positions, dropout, None)
        per_sample = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none"
                                     ).view(labels.shape)
        return ((per_sample * weight).sum(-1) / weight.sum(-1).clamp_min(1.0)).sum()

    compiled = torch.compile(loss)

    def run() -> None:
        for step in range(steps):
            batch = slice(step * BATCH, (step + 1) * BATCH)
            index = draws.order[:, batch]
            dropout.draw(training.token_shape)
            total = compiled(training.packed, tensors.train_x[index], tensors.train_y[index], draws.weight[:, batch])
            training.packed.grad = None
            total.backward()
            optimizer.step(lr, active)

    started = time.perf_counter()
    run()
    return run, time.perf_counter() - started


def fastest(ways: dict[str, Callable[[], None]], repeats: int) -> dict[str, float]:
    best = dict.fromkeys(ways, math.inf)
    for _ in range(repeats):
        for name, way in ways.items():
            started = time.perf_counter()
            way()
            best[name] = min(best[name], time.perf_counter() - started)
    return best


def attention_ways(runs: int, repeats: int) -> dict[str, float]:
    heads, tokens, width = 2, 49, 16
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(runs * BATCH, heads, tokens, width, generator=generator).requires_grad_()
               for _ in range(3))

    def fused() -> None:
        for _ in range(20):
            F.scaled_dot_product_attention(q, k, v).sum().backward()

    def explicit() -> None:
        for _ in range(20):
            scores = q @ k.transpose(-1, -2) * width ** -0.5
            (scores.softmax(-1) @ v).sum().backward()

    return {name: seconds / 20 for name, seconds in fastest({"fused": fused, "explicit": explicit}, repeats).items()}


def profile_shares(run: Callable[[], None], rows: int = 12) -> list[tuple[str, float]]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as recorded:
        run()
    averages = recorded.key_averages()
    total = sum(event.self_cpu_time_total for event in averages)
    ranked = sorted(averages, key=lambda event: event.self_cpu_time_total, reverse=True)[:rows]
    return [(event.key, event.self_cpu_time_total / total) for event in ranked]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"one group of {args.runs} mini Adam runs, batch {BATCH}, dropout on, one thread; torch {torch.__version__}, "
          f"kernels {torch.backends.cpu.get_cpu_capability()}")
    training = group(args.runs)
    eager = builder_steps(training, args.steps)
    eager()
    compiled, compile_seconds = compiled_steps(group(args.runs), args.steps)
    best = fastest({"builder's step": eager, "compiled forward and loss": compiled}, args.repeats)
    base = best["builder's step"]
    for name, seconds in best.items():
        print(f"  {name:<28} {seconds / args.steps * 1e3:7.2f} ms per step, {seconds / args.steps / args.runs * 1e3:.2f} "
              f"ms per run-step ({base / seconds:.2f}x the builder's step)")
    print(f"  compiling took {compile_seconds:.1f} s (first call, its {args.steps} steps included)")
    attention = attention_ways(args.runs, args.repeats)
    for name, seconds in attention.items():
        print(f"  attention, {name:<9} {seconds * 1e3:6.2f} ms forward and backward "
              f"({attention['fused'] / seconds:.2f}x the fused kernel)")
    print(f"profile of {args.steps} steps of the builder's step, share of CPU time by operator:")
    for key, share in profile_shares(eager):
        print(f"  {share:6.1%}  {key}")


if __name__ == "__main__":
    main()
