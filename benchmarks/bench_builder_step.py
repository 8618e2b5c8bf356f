"""Where one optimizer step of a builder's group spends its time on a CPU, and what changes to it would gain.

    python benchmarks/bench_builder_step.py [--runs 10] [--steps 40] [--repeats 3] [--cpp-gemm]

One group of `--runs` Adam runs of the `mini` preset (batch 16, dropout on, no augmentation) on one thread, as
`stz build` trains a group on each core:

1. the step as the builder takes it (forward, loss, backward, the optimizer's update), against the same step in
   bf16 autocast (`--precision bf16`) and against the same forward and loss compiled with `torch.compile` (the
   backward compiled with it by AOTAutograd; the compile's own seconds printed apart), all timed over `--steps`
   steps after warm-up, `--repeats` times interleaved, the fastest counting. `--cpp-gemm` compiles with inductor's
   `max_autotune` and its C++ GEMM templates as candidates beside ATen's (minutes of autotuning);
2. attention at the group's shapes (sequences of 49 tokens, heads of width 16): PyTorch's fused kernel against
   explicit batched matmuls and a softmax, forward and backward;
3. a profile of `--steps` steps of the builder's step: each operator's share of the CPU time, the largest first,
   and the bound it sets: the share of the float32 matmul rate the step would reach if everything but its matmuls
   (and, second, everything but its matmuls and attention) took no time;
4. the bf16 step's three largest operators.

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

from bench_builders import matmul_gflops
from builders.batched import batched_logits, packed_views
from builders.grid import PRESETS, preset_runs
from builders.plan import training_flops_per_sample
from builders.request import load_task_data
from builders.tasks import get_task
from builders.trainer import EpochTotals, GroupTraining, Recipe
from small_transformer_zoo.format.architecture import mnist_spec

BATCH = 16
MATMULS = ("aten::bmm", "aten::baddbmm", "aten::mm", "aten::addmm")
ATTENTION = ("aten::_scaled_dot_product_flash_attention_for_cpu",
             "aten::_scaled_dot_product_flash_attention_for_cpu_backward")


def group(runs: int, precision: str = "fp32") -> GroupTraining:
    preset = PRESETS["mini"]
    data = load_task_data(get_task("mnist"), None, preset)
    chosen = [r for r in preset_runs("mnist", PRESETS["wide"]) if r.optimizer == "adam" and r.dropout > 0][:runs]
    return GroupTraining(chosen, data, mnist_spec(), Recipe(1, (1,), BATCH, False, precision), "cpu", None, False)


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


def compiled_steps(training: GroupTraining, steps: int, cpp_gemm: bool) -> tuple[Callable[[], None], float]:
    """The same steps with forward and loss compiled (the optimizer's update left as it is); the compile's seconds.
    `cpp_gemm`: inductor autotunes each matmul among its C++ GEMM templates and ATen's kernel."""
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

    options = {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"} if cpp_gemm else None
    compiled = torch.compile(loss, options=options)

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


def profile_shares(run: Callable[[], None]) -> list[tuple[str, float]]:
    """Every operator's share of the CPU time of `run`, the largest first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as recorded:
        run()
    averages = recorded.key_averages()
    total = sum(event.self_cpu_time_total for event in averages)
    ranked = sorted(averages, key=lambda event: event.self_cpu_time_total, reverse=True)
    return [(event.key, event.self_cpu_time_total / total) for event in ranked]


def shares_of(shares: list[tuple[str, float]], names: tuple[str, ...]) -> float:
    return sum(share for key, share in shares if key in names)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpp-gemm", action="store_true",
                        help="compile with max_autotune and inductor's C++ GEMM templates (minutes)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"one group of {args.runs} mini Adam runs, batch {BATCH}, dropout on, one thread; torch {torch.__version__}, "
          f"kernels {torch.backends.cpu.get_cpu_capability()}")
    eager, bf16 = builder_steps(group(args.runs), args.steps), builder_steps(group(args.runs, "bf16"), args.steps)
    eager()
    bf16()
    compiled, compile_seconds = compiled_steps(group(args.runs), args.steps, args.cpp_gemm)
    compiled_name = "compiled, C++ GEMMs tuned" if args.cpp_gemm else "compiled forward and loss"
    best = fastest({"builder's step": eager, "bf16 autocast": bf16, compiled_name: compiled}, args.repeats)
    base = best["builder's step"]
    for name, seconds in best.items():
        print(f"  {name:<28} {seconds / args.steps * 1e3:7.2f} ms per step, {seconds / args.steps / args.runs * 1e3:.2f} "
              f"ms per run-step ({base / seconds:.2f}x the builder's step)")
    print(f"  compiling took {compile_seconds:.1f} s (first call, its {args.steps} steps included)")
    attention = attention_ways(args.runs, args.repeats)
    for name, seconds in attention.items():
        print(f"  attention, {name:<9} {seconds * 1e3:6.2f} ms forward and backward "
              f"({attention['fused'] / seconds:.2f}x the fused kernel)")
    shares = profile_shares(eager)
    print(f"profile of {args.steps} steps of the builder's step, share of CPU time by operator:")
    for key, share in shares[:12]:
        print(f"  {share:6.1%}  {key}")
    rate = args.runs * args.steps * BATCH * training_flops_per_sample(mnist_spec()) / base / 1e9
    peak = matmul_gflops(torch.device("cpu"), torch.float32)
    matmuls, attention_share = shares_of(shares, MATMULS), shares_of(shares, ATTENTION)
    print(f"the step: {rate:.1f} GFLOP/s, {rate / peak:.1%} of one thread's float32 matmul 2048x2048 "
          f"({peak:.1f} GFLOP/s)")
    print(f"  with only its matmuls ({matmuls:.1%} of the time) left: {rate / matmuls / peak:.1%} of matmul")
    print(f"  with only its matmuls and attention ({matmuls + attention_share:.1%}) left: "
          f"{rate / (matmuls + attention_share) / peak:.1%} of matmul")
    print("profile of the bf16 step, its largest operators:")
    for key, share in profile_shares(bf16)[:3]:
        print(f"  {share:6.1%}  {key}")


if __name__ == "__main__":
    main()
