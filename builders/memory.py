"""What one run of a group costs in memory on a device, measured there (`bytes_per_run`).

A group's peak memory is its runs' weights, gradients and optimizer state, the batch's activations kept for the
backward pass and the backward pass's temporaries. Counting them from the model's shapes proved four times too
high (the saved tensors of a batch overlap, and the backward pass frees as it goes), so the figure is measured:
two small groups of Adam runs (the optimizer with the most state) each take two real training steps of
`GroupTraining` on the device, with the build's batch size, precision, crops and dropout, and the per-run cost is
the slope of their peak allocations. Fixed costs (the data, the kernels' workspaces) fall out of the slope.

The peak is the allocator's own figure: `torch.cuda.max_memory_allocated` on a GPU, and on a CPU the running total
of the allocations and frees that `torch.profiler` records (`profile_memory=True`), which no other memory of the
process disturbs.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache

import torch

from small_transformer_zoo.format.architecture import ArchitectureSpec

from .grid import Run
from .trainer import GroupTraining, Recipe, TrainingTensors

CALIBRATION_GROUPS = (2, 6)  # the two group sizes whose peaks give the slope
CALIBRATION_STEPS = 2         # the second step holds the optimizer state the first one creates


def probe_runs(count: int) -> list[Run]:
    """Adam runs with dropout on, as a build's runs train (their values do not change the memory)."""
    return [Run(f"memory-probe-{i}", "adam", 1.0, 0.1, 1e-3, 0.05, 1e-4, seed=i) for i in range(count)]


def probe_data(spec: ArchitectureSpec, batch_size: int, tokens: int, device: torch.device) -> TrainingTensors:
    """One batch of random training inputs on the device (one step per epoch), and one of each other split."""
    generator = torch.Generator().manual_seed(0)
    if spec.modality == "vision":
        x = torch.randn(batch_size + 2, spec.in_channels, spec.image_size, spec.image_size, generator=generator)
        embedding = None
    else:
        x = torch.randint(1, spec.vocab_size, (batch_size + 2, tokens), generator=generator)
        embedding = torch.randn(spec.vocab_size, spec.d_model, generator=generator).to(device)
    y = torch.randint(0, spec.num_classes, (batch_size + 2,), generator=generator)
    x, y = x.to(device), y.to(device)
    return TrainingTensors(x[:batch_size], y[:batch_size], x[-2:-1], y[-2:-1], x[-1:], y[-1:], embedding)


def group_peak_bytes(spec: ArchitectureSpec, runs: int, batch_size: int, precision: str, tokens: int,
                     device: torch.device, crop: bool) -> int:
    """Peak bytes a group of `runs` allocates on `device` over its first training steps, above what the device
    held before the group was made (module docstring)."""
    data = probe_data(spec, batch_size, tokens, device)
    recipe = Recipe(CALIBRATION_STEPS, (), batch_size, crop, precision)

    def train() -> None:
        training = GroupTraining(probe_runs(runs), data, spec, recipe, device, None, None)
        for epoch in range(1, CALIBRATION_STEPS + 1):
            draws = training.streams.epoch(batch_size, training.crop,
                                           training.hashed and bool(training.dropout.drawing))
            training.train_epoch(epoch, draws)

    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        train()
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) - before
    if device.type != "cpu":
        raise ValueError(f"memory of a group cannot be measured on {device}: only cpu and cuda are supported")
    return _cpu_peak(train)


@contextmanager
def _native_stderr_silenced() -> Iterator[None]:
    """File descriptor 2 pointed at /dev/null: the profiler's native library writes a line to it at every start and
    stop, which no setting turns off, and a build's output should not carry them."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _cpu_peak(work: Callable[[], None]) -> int:
    """The highest running total of the CPU allocator's allocations minus frees while `work` runs."""
    from torch.profiler import ProfilerActivity, profile

    with _native_stderr_silenced(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as recorded:
        work()
    total = peak = 0
    for event in sorted(recorded.events(), key=lambda e: e.time_range.start):
        total += event.self_cpu_memory_usage
        peak = max(peak, total)
    return peak


@lru_cache(maxsize=32)
def _measured(spec: ArchitectureSpec, batch_size: int, precision: str, tokens: int, device: torch.device,
              crop: bool) -> int:
    small, large = (group_peak_bytes(spec, count, batch_size, precision, tokens, device, crop)
                    for count in CALIBRATION_GROUPS)
    return max(1, -(-(large - small) // (CALIBRATION_GROUPS[1] - CALIBRATION_GROUPS[0])))


def bytes_per_run(spec: ArchitectureSpec, batch_size: int, precision: str, tokens: int,
                  device: torch.device | str = "cpu", crop: bool = False) -> int:
    """Memory one more run of a group needs on `device` while it trains, measured there (module docstring);
    the same arguments are measured once per process."""
    return _measured(spec, batch_size, precision, tokens, torch.device(device), crop)
