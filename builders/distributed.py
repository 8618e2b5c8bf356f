"""Run a build's groups as tasks on a Ray cluster (`stz build --ray`); `ray` is an optional extra.

The driver keeps writing parts exactly as a local build does, so a Ray build resumes, shards and merges the same
way, and makes the same zoo.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from small_transformer_zoo.devices import kernel_set
from small_transformer_zoo.format.architecture import ArchitectureSpec

from .data import TaskData
from .grid import Run, group_id
from .parts import save_part
from .request import Build
from .trainer import Checkpoint, Recipe, train_group


def _train_task(group: list[Run], data: TaskData, spec: ArchitectureSpec, recipe: Recipe,
                device: str) -> tuple[list[Checkpoint], str]:
    """One group trained on the worker, with the kernel set it was computed by there."""
    return train_group(group, data, spec, recipe, device), kernel_set(device)


def ray_executor(address: str | None = None, num_cpus: int | None = None) -> Callable[..., None]:
    """An executor for `run_build` that trains each group as one Ray task (`address=None`: a local instance)."""
    try:
        import ray
    except ImportError:
        raise RuntimeError("--ray needs Ray: pip install 'small-transformer-zoo[ray]'") from None

    def execute(todo: list[list[Run]], build: Build, parts: Path, progress: bool) -> None:
        from tqdm import tqdm


        if not ray.is_initialized():
            ray.init(address=address, num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
        on_gpu = build.placement.device.type == "cuda"
        remote = ray.remote(num_gpus=1 if on_gpu else 0)(_train_task)
        data_ref = ray.put(build.data)
        device = "cuda" if on_gpu else "cpu"  # Ray gives each GPU task its own visible device
        pending = {remote.remote(g, data_ref, build.spec, build.plan.recipe(), device): g for g in todo}
        bars = progress and sys.stderr.isatty()
        with tqdm(total=len(todo), desc="ray tasks", unit="group", disable=not bars, file=sys.stderr) as bar:
            while pending:
                done, _ = ray.wait(list(pending), num_returns=1)
                for ref in done:
                    group = pending.pop(ref)
                    checkpoints, kernels = ray.get(ref)
                    save_part(parts, group_id(group), checkpoints, device, kernels)
                    bar.update(1)

    return execute
