"""The three ways a test reads a split's weights: the fast path (`Zoo`), `load_dataset` and streaming."""

from __future__ import annotations

from pathlib import Path

import torch

from small_transformer_zoo import Zoo, load_dataset


def read_fast_path(root: Path) -> torch.Tensor:
    return Zoo.open(root, "syn").split_weights("train").to_tensor()


def read_with_load_dataset(root: Path) -> torch.Tensor:
    """`load_dataset` with a `datasets` cache of its own beside the zoo, so no other test's cache answers."""
    loaded = load_dataset(str(root), "syn", split="train", cache_dir=str(root.parent / "datasets-cache"))
    return loaded.with_format("torch")[:]["params"]


def read_streaming(root: Path) -> torch.Tensor:
    rows = load_dataset(str(root), "syn", split="train", streaming=True).with_format("torch")
    return torch.stack([row["params"] for row in rows])


def read_labelled(root: Path, read: str) -> tuple[torch.Tensor, list[float]]:
    """The train split's weights and test accuracies through one read path, by its name."""
    if read == "fast path":
        weights = Zoo.open(root, "syn").split_weights("train")
        return weights.to_tensor(), weights.metadata.column("test_accuracy").to_pylist()
    if read == "streaming":
        rows = list(load_dataset(str(root), "syn", split="train", streaming=True).with_format("torch"))
        return torch.stack([r["params"] for r in rows]), [float(r["test_accuracy"]) for r in rows]
    loaded = load_dataset(str(root), "syn", split="train", cache_dir=str(root.parent / "datasets-cache"))
    return loaded.with_format("torch")[:]["params"], loaded["test_accuracy"]


READ_PATHS = {"fast path": read_fast_path, "load_dataset": read_with_load_dataset, "streaming": read_streaming}
