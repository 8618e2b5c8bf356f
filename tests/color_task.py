"""A task module for tests: 3x32x32 colour images made here, 10 classes (a fixed random pattern per class plus
noise). Importing it registers the task `color32`; it is the only code a new image task needs."""

from __future__ import annotations

import hashlib

import numpy as np

from builders.data import TaskData, split_validation
from builders.tasks import DataRequest, Task, register_task, vision_spec


def make_images(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    patterns = np.random.default_rng(1234).normal(0.0, 1.0, (10, 3, 32, 32)).astype(np.float32)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, count)
    images = patterns[labels] + rng.normal(0.0, 1.5, (count, 3, 32, 32)).astype(np.float32)
    return images, labels.astype(np.int64)


def load(request: DataRequest) -> TaskData:
    train_x, train_y = make_images(320, seed=0)
    test_x, test_y = make_images(100, seed=1)
    train_x, train_y, val_x, val_y = split_validation(train_x, train_y)
    digest = hashlib.sha256(train_x.tobytes() + test_x.tobytes()).hexdigest()
    return TaskData("vision", 10, train_x, train_y, val_x, val_y, test_x, test_y,
                    source={"dataset": "color32", "from": "tests/color_task.py (synthetic)", "sha256": digest})


TASK = register_task(Task(name="color32", description="Synthetic 3x32x32 colour patterns, 10 classes.", load=load,
                          spec=vision_spec, data_help="made in memory; no data needed"))
