"""Device names as every command takes them (`auto`, `cpu`, `cuda` or `cuda:N`, checked before any work starts),
the CPU cores a process may use, and the kernel set a device computes with."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    """`auto` (CUDA when torch sees a GPU, else the CPU), `cpu`, `cuda` or `cuda:N`."""
    import torch  # here, not at the top: the command line reads `usable_cores` without loading torch

    base = name.split(":", 1)[0]
    if base not in DEVICES or (":" in name and base != "cuda"):
        raise ValueError(f"unknown device {name!r}; devices are {list(DEVICES)} (or cuda:N)")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if base == "cuda":
        if not torch.cuda.is_available():
            build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
            raise ValueError(f"device {name!r}: torch {torch.__version__} ({build}) sees no CUDA GPU; use --device cpu")
        device = torch.device(name)
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r}: only {torch.cuda.device_count()} CUDA device(s) here")
        return device
    return torch.device("cpu")


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def kernel_set(device: torch.device | str) -> str:
    """The kernels that compute on `device`, as a build records them: `cpu AVX512` (torch's CPU capability), or
    `cuda <GPU name> sm_<major><minor> CUDA <version>`. Rounding, and so a trained run's exact bytes, depend on it."""
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"cuda {torch.cuda.get_device_name(device)} sm_{major}{minor} CUDA {torch.version.cuda}"
    return f"{device.type} {torch.backends.cpu.get_cpu_capability()}"
