"""The task registry: what a zoo is trained on (docs/design.md section 4).

A task is one module: its data source, the architecture its data calls for, its defaults and the text the dataset
card shows. Every module in this package registers its task when the registry is first read; another package adds
tasks through the `stz.tasks` entry point group (a module that calls `register_task`), and a script or test by
importing a module that calls it. Nothing else names tasks: `stz build --task` offers the registered ones, and the
build reads everything it needs from the task (CONTRIBUTING.md, "Add a task").
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from small_transformer_zoo.format.architecture import ArchitectureSpec

from ..data import TaskData


@dataclass(frozen=True)
class DataRequest:
    """What a build asks of a task's loader: where the data is (None: the task's default source), how many training
    samples at most, task-specific options (`word2vec` for text), and whether a source without training files may
    have its test files carved into train and test (never silently: a zoo trained on test samples must say so)."""

    data_dir: str | Path | None
    max_train_samples: int | None
    options: dict[str, Any] = field(default_factory=dict)
    carve_from_test: bool = False


@dataclass(frozen=True)
class Task:
    """One registered task. `load` must check its files before any training starts and describe its source in
    `TaskData.source` (it goes into the zoo's provenance); `spec` gives the architecture for the loaded data."""

    name: str
    description: str
    load: Callable[[DataRequest], TaskData]
    spec: Callable[[TaskData], ArchitectureSpec]
    data_help: str
    options: tuple[str, ...] = ()


TASKS: dict[str, Task] = {}
_discovered = False


def register_task(task: Task) -> Task:
    """Add a task to the registry; registering the same name twice is an error, unless it is the same task."""
    if TASKS.get(task.name, task) is not task:
        raise ValueError(f"a task named {task.name!r} is already registered")
    TASKS[task.name] = task
    return task


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    _discovered = True
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")
    for entry in entry_points(group="stz.tasks"):
        entry.load()


def task_names() -> list[str]:
    _discover()
    return list(TASKS)


def get_task(name: str) -> Task:
    _discover()
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; tasks are {list(TASKS)}")
    return TASKS[name]


def vision_spec(data: TaskData) -> ArchitectureSpec:
    """The paper's vision transformer for images of the data's channels and size (4x4 patches)."""
    channels, size = int(data.train_x.shape[1]), int(data.train_x.shape[-1])
    return ArchitectureSpec(modality="vision", num_classes=data.num_classes, image_size=size, in_channels=channels)
