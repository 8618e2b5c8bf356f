"""Zoo training throughput on a CPU or an accelerator.

    python benchmarks/bench_builders.py [--repeats 3]                  # CPU, the mini preset's settings
    python benchmarks/bench_builders.py --device cuda                  # one GPU, group sizes 64 to 4,096
    python benchmarks/bench_builders.py --step-times                   # one CPU core: a step by group size

CPU: the same runs (`--runs` Adam runs of the `mini` preset, embedded MNIST, `--train-samples` training samples,
one epoch, then validation and test) are trained by a plain one-model-at-a-time PyTorch loop (`ZooTransformer` +
torch.optim) and by the vectorized trainer: one group on every core, and one group per core (what `stz build`
does). Same work on every side; each way runs `--repeats` times, interleaved, and the fastest counts (the machine
is shared). Achieved GFLOP/s (analytic training and evaluation FLOPs / time) is compared with a large float32
matmul measured in the same command.

CUDA (the group-size sweep): groups of 64 to 4,096 runs (those that fit in free memory) at the paper's batch of
128 with crops, in fp32, TF32 (`--precisions tf32`: fp32 weights, TF32 matmuls) and bf16, against the GPU's fp32
and bf16 matmul throughput measured in the same command;
then the `paper` preset's GPU-hours per task at the best rate. `--sweep` runs the same sweep on a CPU (with small
`--group-sizes`), which is how its code path is checked without a GPU.

Step times (`--step-times`): milliseconds per optimizer step of one group of `mini` Adam runs on one thread, per
group size (`--group-sizes`, default 5 10 17 33), each timed over whole epochs of `--train-samples`, the fastest
of `--repeats`; then one group of 10 trained `--flush-epochs` epochs twice from the same start, with denormals
kept and flushed to zero (`torch.set_flush_denormal`), interleaved, with how many of the trained weights differ.

The first two end with the `paper` preset's cost: 16,000 runs x 100 epochs on 54,000 training images, validation every
epoch, test at the five checkpoints.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from common import PROJECT  # noqa: F401  (sets up the import path)

from builders.memory import bytes_per_run
from builders.placement import choose_group_size
from builders.plan import training_flops_per_sample
from builders.request import load_task_data
from small_transformer_zoo.devices import resolve_device
from builders.grid import PRESETS, full_grid, preset_runs
from builders.reference import train_run_plain
from builders.tasks import get_task
from builders.trainer import GroupTraining, Recipe, TrainingTensors, train_group, train_groups
from small_transformer_zoo.format.architecture import mnist_spec

PAPER_TRAIN, PAPER_VALIDATION, PAPER_TEST = 54_000, 6_000, 10_000


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_gflops(device: torch.device, dtype: torch.dtype, size: int = 2048, seconds: float = 1.0) -> float:
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    a @ b
    synchronize(device)
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(10):
            a @ b
        synchronize(device)
        count += 10
    return 2 * size ** 3 * count / (time.perf_counter() - start) / 1e9


def best_of(ways: dict[str, Callable[[], object]], repeats: int, device: torch.device) -> dict[str, float]:
    """Fastest wall time of each way over `repeats` interleaved rounds."""
    best = dict.fromkeys(ways, math.inf)
    for _ in range(repeats):
        for name, way in ways.items():
            synchronize(device)
            start = time.perf_counter()
            way()
            synchronize(device)
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def paper_flops(spec) -> float:
    grid = full_grid("mnist")
    train = sum(round(r.train_fraction * PAPER_TRAIN) for r in grid) * 100 * training_flops_per_sample(spec)
    evaluation = len(grid) * (100 * PAPER_VALIDATION + 5 * PAPER_TEST) * training_flops_per_sample(spec) / 3
    return train + evaluation


def cpu_benchmark(args: argparse.Namespace) -> None:
    preset = PRESETS["mini"]
    data = load_task_data(get_task("mnist"), None, preset)
    data.train_x, data.train_y = data.train_x[: args.train_samples], data.train_y[: args.train_samples]
    spec = mnist_spec()
    runs = [r for r in preset_runs("mnist", preset) if r.optimizer == "adam"][: args.runs]
    runs += [replace(r, run_id=f"{r.run_id}-copy") for r in runs][: args.runs - len(runs)]
    batch, augment = preset.batch_size, preset.augment
    samples = sum(round(r.train_fraction * len(data.train_y)) for r in runs)
    flops = (samples + len(runs) * (len(data.validation_y) + len(data.test_y)) / 3) * training_flops_per_sample(spec)
    cores = torch.get_num_threads()
    print(f"{len(runs)} adam runs of the mini preset (batch {batch}, augmentation {augment}), 1 epoch of "
          f"{len(data.train_y)} training samples, then {len(data.validation_y)} validation and {len(data.test_y)} "
          f"test; torch {torch.__version__}, {cores} threads")
    peak = matmul_gflops(torch.device("cpu"), torch.float32)
    bf16_peak = matmul_gflops(torch.device("cpu"), torch.bfloat16, size=512, seconds=0.5)
    per_core = [runs[i::cores] for i in range(cores)]
    ways = {
        "plain": lambda: [train_run_plain(r, data, spec, 1, [1], batch, augment) for r in runs],
        "one group, every core": lambda: train_group(runs, data, spec, Recipe(1, (1,), batch, augment)),
        "one group per core": lambda: list(train_groups(per_core, data, spec, Recipe(1, (1,), batch, augment))),
    }
    best = best_of(ways, args.repeats, torch.device("cpu"))
    plain = best["plain"]
    for name, seconds in best.items():
        ratio = "" if name == "plain" else f"  {plain / seconds:.2f}x the plain loop"
        print(f"  {name:<24}{len(runs) / seconds:7.2f} model-epochs/s {flops / seconds / 1e9:7.1f} GFLOP/s "
              f"({flops / seconds / 1e9 / peak:.1%} of matmul){ratio}")
    print(f"float32 matmul 2048x2048    {peak:7.1f} GFLOP/s (the machine's practical limit)")
    print(f"bfloat16 matmul 512x512     {bf16_peak:7.1f} GFLOP/s "
          f"({'native' if torch.ops.mkldnn._is_mkldnn_bf16_supported() else 'emulated: no AVX512-BF16 or AMX here'})")
    rate = flops / best["one group per core"]
    total = paper_flops(spec)
    print(f"\npaper preset, one task: {total / 1e15:.1f} PFLOP; at {rate / 1e9:.1f} GFLOP/s "
          f"{total / rate / 86400:,.0f} days on this machine, {total / rate / 86400 / 100:,.1f} days on 100 of them")


def _train_epochs(runs: list, data, spec, recipe: Recipe, epochs: int) -> tuple[float, int, torch.Tensor]:
    """Seconds and steps of `epochs` training epochs of one group (no evaluation), and its weights after them."""
    training = GroupTraining(runs, data, spec, recipe, "cpu", None, False)
    seconds, steps = 0.0, 0
    for epoch in range(1, epochs + 1):
        draws = training.streams.epoch(recipe.batch_size, False, False)
        start = time.perf_counter()
        training.train_epoch(epoch, draws)
        seconds += time.perf_counter() - start
        steps += draws.max_steps
    return seconds, steps, training.packed.detach().clone()


def step_times(args: argparse.Namespace) -> None:
    """Milliseconds per step of one group on one core by group size, then with denormals flushed to zero."""
    torch.set_num_threads(1)
    preset = PRESETS["mini"]
    data = load_task_data(get_task("mnist"), None, preset)
    data.train_x, data.train_y = data.train_x[: args.train_samples], data.train_y[: args.train_samples]
    spec = mnist_spec()
    adam = [r for r in preset_runs("mnist", preset) if r.optimizer == "adam"]
    recipe = Recipe(1, (1,), preset.batch_size, preset.augment)
    sizes = [size for size in args.group_sizes if size <= len(adam)]
    print(f"groups of mini adam runs (batch {recipe.batch_size}), epochs of {len(data.train_y)} training samples, "
          f"one thread; torch {torch.__version__}, kernels {torch.backends.cpu.get_cpu_capability()}")
    first = None
    for size in sizes:
        seconds, steps = min(_train_epochs(adam[:size], data, spec, recipe, 1)[:2] for _ in range(args.repeats))
        per_run = seconds / steps / size * 1e3
        first = first or per_run
        print(f"  {size:>3} runs: {seconds / steps * 1e3:7.1f} ms per step, {per_run:.2f} ms per run-step "
              f"({per_run / first:.2f}x the {sizes[0]}-run group's)")
    group = adam[:10]
    best = {False: math.inf, True: math.inf}
    weights = {}
    for _ in range(args.repeats):
        for flush in (False, True):
            torch.set_flush_denormal(flush)
            seconds, steps, weights[flush] = _train_epochs(group, data, spec, recipe, args.flush_epochs)
            best[flush] = min(best[flush], seconds / steps * 1e3)
    torch.set_flush_denormal(False)
    differ = int((weights[False] != weights[True]).sum())
    print(f"  10 runs, {args.flush_epochs} epochs: denormals kept {best[False]:.1f} ms per step, flushed to zero "
          f"{best[True]:.1f} ms ({best[False] / best[True]:.2f}x); {differ:,} of {weights[False].numel():,} "
          f"trained weights differ")


def group_size_sweep(args: argparse.Namespace) -> None:
    """Model-epochs/s per group size and precision on one device (a GPU; `--sweep` runs it on a CPU too)."""
    device = resolve_device(args.device)
    spec = mnist_spec()
    data = load_task_data(get_task("mnist"), args.data_dir, PRESETS["paper"])
    data.train_x, data.train_y = data.train_x[: args.train_samples], data.train_y[: args.train_samples]
    tensors = TrainingTensors.of(data, device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"{name}, torch {torch.__version__}; one epoch of {len(data.train_y)} samples at batch 128 with crops, "
          f"then {len(data.validation_y)} validation and {len(data.test_y)} test")
    size = 8192 if device.type == "cuda" else 512
    peaks = {"fp32": matmul_gflops(device, torch.float32, size), "bf16": matmul_gflops(device, torch.bfloat16, size)}
    print(f"matmul {size}x{size}: fp32 {peaks['fp32'] / 1e3:.2f} TFLOP/s, bf16 {peaks['bf16'] / 1e3:.2f} TFLOP/s")
    grid = [r for r in full_grid("mnist") if r.optimizer == "adam"]
    per_sample = training_flops_per_sample(spec)
    best_rate: dict[str, tuple[float, int]] = {}
    for label in args.precisions:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = label == "tf32"
        precision = "fp32" if label == "tf32" else label
        for size in args.group_sizes:
            try:
                choose_group_size(size, device, spec, 128, precision, spec.num_tokens, 10, len(grid), crop=True)
            except ValueError as error:
                print(f"  {label} {size:>5} runs: skipped ({error})")
                continue
            runs = grid[:size]
            samples = sum(round(r.train_fraction * len(data.train_y)) for r in runs)
            flops = (samples + size * (len(data.validation_y) + len(data.test_y)) / 3) * per_sample
            recipe = Recipe(1, (1,), 128, True, precision)
            try:
                train_group(runs[: min(size, 8)], tensors, spec, recipe, device)
                seconds = best_of({"group": lambda: train_group(runs, tensors, spec, recipe, device)}, args.repeats,
                                  device)["group"]
            except RuntimeError as error:
                print(f"  {label} {size:>5} runs: failed ({' '.join(str(error).split())[:200]})")
                continue
            rate = flops / seconds
            if rate > best_rate.get(label, (0.0, 0))[0]:
                best_rate[label] = (rate, size)
            estimate = size * bytes_per_run(spec, 128, precision, spec.num_tokens, device, crop=True)
            memory = (f"  peak memory {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB, estimated "
                      f"{estimate / 2**30:.1f} GiB" if device.type == "cuda" else
                      f"  memory estimated {estimate / 2**30:.2f} GiB")
            print(f"  {label} {size:>5} runs: {size / seconds:9.1f} model-epochs/s  {rate / 1e12:7.3f} TFLOP/s  "
                  f"({rate / 1e9 / peaks[precision]:.1%} of {precision} matmul){memory}", flush=True)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
    total = paper_flops(spec)
    for precision, (rate, size) in best_rate.items():
        print(f"paper preset, one task ({total / 1e15:.1f} PFLOP), {precision} in groups of {size}: "
              f"{total / rate / 3600:,.1f} device-hours")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda / cuda:N")
    parser.add_argument("--runs", type=int, default=20, help="CPU: runs per way")
    parser.add_argument("--train-samples", type=int, default=1200, help="training samples per epoch")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--group-sizes", type=int, nargs="+",
                        help="runs per group (default: 64 256 1024 4096 for the sweep, 5 10 17 33 for --step-times)")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"], choices=["fp32", "tf32", "bf16"],
                        help="group-size sweep: precisions (tf32: fp32 weights with TF32 matmuls on a GPU)")
    parser.add_argument("--data-dir", help="group-size sweep: an MNIST IDX folder (default: the embedded digits)")
    parser.add_argument("--sweep", action="store_true", help="run the group-size sweep on a CPU too")
    parser.add_argument("--step-times", action="store_true", help="CPU: ms per step by group size, and with "
                                                                  "denormals flushed to zero")
    parser.add_argument("--flush-epochs", type=int, default=2, help="--step-times: epochs of the flush comparison")
    args = parser.parse_args()
    if args.step_times:
        args.group_sizes = args.group_sizes or [5, 10, 17, 33]
        step_times(args)
    elif resolve_device(args.device).type == "cpu" and not args.sweep:
        cpu_benchmark(args)
    else:
        args.group_sizes = args.group_sizes or [64, 256, 1024, 4096]
        group_size_sweep(args)


if __name__ == "__main__":
    main()
