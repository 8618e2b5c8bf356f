"""Synthetic zoos (random weights, made-up accuracies) for tests, benchmarks and demos; never for research.

Their provenance says `synthetic: true`, so a synthetic zoo cannot be mistaken for a trained one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from ..format.architecture import ArchitectureSpec, mnist_spec
from ..format.metadata import OPTIMIZERS
from ..store.writer import ZooWriter



def write_synthetic_zoo(
    root: str | os.PathLike[str],
    config: str = "synthetic",
    *,
    runs: int = 20,
    epochs: tuple[int, ...] = (1, 5, 10),
    spec: ArchitectureSpec | None = None,
    seed: int = 0,
    **writer_kwargs: Any,
) -> dict[str, Any]:
    """Write `runs` runs x (len(epochs) + 1 best) checkpoints; returns the manifest."""
    spec = spec or mnist_spec()
    rng = np.random.default_rng(seed)
    with ZooWriter(root, config, spec, task={"name": "synthetic", "source": "numpy random"},
                   provenance={"synthetic": True, "seed": seed}, checkpoint_epochs=[*epochs, "best"],
                   **writer_kwargs) as writer:
        for run in range(runs):
            run_id = f"run-{run:05d}"
            hyper: Mapping[str, Any] = {
                "optimizer": OPTIMIZERS[run % 4], "learning_rate": float(10 ** rng.uniform(-4, -1)),
                "dropout": float(rng.choice([0.0, 0.05, 0.1, 0.15, 0.2])),
                "w_init_std": float(rng.choice([0.1, 0.2, 0.3])), "l2": float(rng.choice([1e-8, 1e-6, 1e-4])),
                "train_fraction": float(rng.choice([0.7, 0.8, 0.9, 1.0])), "seed": run,
            }
            ceiling = rng.uniform(0.1, 0.99)
            best_epoch = int(rng.choice(epochs))
            for epoch, is_best in [*((e, False) for e in epochs), (best_epoch, True)]:
                accuracy = float(ceiling * (1 - np.exp(-epoch / 3)))
                params = rng.normal(0.0, hyper["w_init_std"], spec.n_params).astype(np.float32)
                writer.add(params, {"run_id": run_id, "epoch": epoch, "is_best": is_best, **hyper,
                                    "test_accuracy": accuracy, "validation_accuracy": accuracy,
                                    "train_accuracy": min(1.0, accuracy * 1.05), "test_loss": 2.3 * (1 - accuracy)})
        if spec.modality == "text":
            table = rng.normal(size=(spec.vocab_size, spec.d_model)).astype(np.float32)
            writer.add_extra("embedding", {"table": table})
        return writer.close()
