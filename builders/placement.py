"""Where a build trains (`plan_placement`): the device, its numeric precision, and how many runs fit in one group
there.

Everything is checked before any training starts: an unknown device, `cuda` without a GPU, bf16 where the device
has no bf16 arithmetic, and a group size that does not fit in the device's free memory (with what it needs).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from small_transformer_zoo.devices import resolve_device, usable_cores
from small_transformer_zoo.format.architecture import ArchitectureSpec


from .grid import OPTIMIZERS
from .memory import bytes_per_run
from .plan import Placement
from .request import Build
from .trainer import PRECISIONS

MAX_GROUP = 4096           # runs per group on an accelerator, at most
MEMORY_HEADROOM = 0.85     # share of the free memory a build plans to use


def check_precision(device: torch.device, precision: str) -> None:
    """bf16 needs bf16 arithmetic on the device: Ampere or newer GPUs, or CPUs with AVX512-BF16 / AMX (elsewhere
    PyTorch emulates it on a CPU, hundreds of times slower than float32)."""
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; precisions are {list(PRECISIONS)}")
    if precision != "bf16":
        return
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"precision bf16: {torch.cuda.get_device_name(device)} has no bf16 support; use fp32")
    if device.type == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        raise ValueError("precision bf16: this CPU has no native bf16 arithmetic (AVX512-BF16 or AMX), so bf16 "
                         "would be emulated and far slower than fp32; use --precision fp32")


def free_memory(device: torch.device) -> int:
    """Bytes free on the device: CUDA's own figure, or the host's available memory for the CPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def choose_group_size(requested: int | str, device: torch.device, spec: ArchitectureSpec, batch_size: int,
                      precision: str, tokens: int, cpu_default: int, largest_family: int, workers: int = 1,
                      free_bytes: int | None = None, crop: bool = False) -> int:
    """Runs per group: `auto` is the preset's size on a CPU and as many as fit (up to the largest optimizer
    family, at most MAX_GROUP) on an accelerator; a number is checked against the free memory. What a run needs
    is measured on the device (`memory.bytes_per_run`)."""
    free = free_memory(device) if free_bytes is None else free_bytes
    per_run = bytes_per_run(spec, batch_size, precision, tokens, device, crop)
    budget = int(free * MEMORY_HEADROOM) // max(1, workers)
    fits = budget // per_run
    gib = 1024 ** 3
    if requested == "auto":
        size = min(cpu_default if device.type == "cpu" else min(largest_family, MAX_GROUP), fits)
        if size < 1:
            raise ValueError(f"not even one run fits on {device}: one needs {per_run / gib:.2f} GiB at batch "
                             f"{batch_size}, {free / gib:.2f} GiB free")
        return size
    size = int(requested)
    if size < 1:
        raise ValueError(f"group size must be at least 1, got {size}")
    if size > fits:
        raise ValueError(f"group size {size} does not fit on {device}: it needs {size * per_run * workers / gib:.2f} "
                         f"GiB ({per_run / 2**20:.1f} MiB per run at batch {batch_size}, {precision}"
                         f"{f', {workers} workers' if workers > 1 else ''}), {free / gib:.2f} GiB free; at most "
                         f"{fits} fit")
    return size


def plan_placement(build: Build, free_bytes: int | None = None) -> Placement:
    """Resolve `--device`, check `--precision` there and choose the group size (errors before any training)."""
    request, spec, data = build.request, build.spec, build.data
    where = resolve_device(request.device)
    check_precision(where, build.plan.precision)
    tokens = spec.num_tokens if spec.modality == "vision" else data.train_x.shape[1]
    family = max(sum(r.optimizer == o for r in build.mine) for o in OPTIMIZERS)
    parallel = (request.workers or usable_cores()) if where.type == "cpu" else 1
    crop = build.plan.augment and spec.modality == "vision"
    size = choose_group_size(request.group_size, where, spec, build.plan.batch_size, build.plan.precision, tokens,
                             request.preset.group_size, family, parallel, free_bytes, crop)
    return Placement(where, size, request.workers)
