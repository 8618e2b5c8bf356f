"""Fashion-MNIST: 28x28 grey clothing images, 10 classes, from the Debian package or an IDX folder."""

from __future__ import annotations

from pathlib import Path

from small_transformer_zoo.errors import ZooNotFoundError

from ..data import FASHION_MNIST_DIR, TaskData, hub_repo, load_hub_images, load_idx_folder
from . import DataRequest, Task, register_task, vision_spec


def load(request: DataRequest) -> TaskData:
    repo = hub_repo(request.data_dir)
    if repo is not None:
        return load_hub_images(repo, "fashion_mnist")
    folder = Path(request.data_dir) if request.data_dir else FASHION_MNIST_DIR
    if not folder.is_dir():
        raise ZooNotFoundError(folder, "no Fashion-MNIST here: `apt-get install dataset-fashion-mnist` installs it "
                                     "there, or pass --data-dir")
    return load_idx_folder(folder, "fashion_mnist", request.carve_from_test)


TASK = register_task(Task(
    name="fashion_mnist",
    description="Fashion-MNIST clothing images (28x28 grey, 10 classes).",
    load=load, spec=vision_spec,
    data_help=f"a Fashion-MNIST IDX folder or hf://datasets/<repo> (default: {FASHION_MNIST_DIR})"))
