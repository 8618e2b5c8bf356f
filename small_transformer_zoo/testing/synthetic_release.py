"""A small release in the authors' layout, from random models: for tests, the import benchmark and trying the
importer without the 5 GB download; never for research.

It writes what the original scripts leave: `<top>/metadata/<dataset>.csv` (the run's whole config per row, no
run-id column, `ckpt_epoch`, `ckpt_file`, the accuracy) and `<top>/<dataset>/<run>_<epoch>_<acc>.pt` files with the
original module's tensor names; text releases add `<dataset>/embedding.pt` and keep `embedding.*` out of the
checkpoints. Best rows carry the long training-time `ckpt_file` path the scripts wrote.

With `learnable=True` each checkpoint's accuracy is a known function of an invariant of its weights
(`labelled_weights.shifted_bias_weights`), so predictors trained on the imported zoo have something to find; the
scale rehearsal (`benchmarks/scale_rehearsal.py`) writes releases of the authors' size that way.
"""

from __future__ import annotations

import csv
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..format.architecture import ArchitectureSpec, mnist_spec
from ..original.layout import TEXT_COLUMNS, VISION_COLUMNS, original_names
from ..weights.model import ZooTransformer, sinusoidal_positions
from ..weights.weight_space import TransformerWeights
from .labelled_weights import shifted_bias_weights

OPTIMIZERS = ("SGD", "SGDm", "Adam", "RMSprop")


@dataclass
class SyntheticRelease:
    """What was written: the top folder, the CSV, and each row's file name and state_dict (this package's names)."""

    top: Path
    csv_path: Path
    weights: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    accuracies: dict[str, float] = field(default_factory=dict)


def write_synthetic_release(folder: str | os.PathLike[str], *, runs: int = 4, text: bool = False,
                            epochs: tuple[str, ...] = ("1", "50", "75", "100"), seed: int = 0,
                            spec: ArchitectureSpec | None = None, checkpoints: int | None = None,
                            learnable: bool = False, keep_weights: bool = True) -> SyntheticRelease:
    """Write a release of `runs` runs x (epochs + best) checkpoints under `folder/<top>/`.

    `checkpoints`: write exactly this many instead (as many runs as that takes, the last one cut short, as the
    release's runs with dropped rows are); `learnable`: accuracies that the weights determine (module docstring);
    `keep_weights=False` keeps no state_dict in memory (a release of the authors' size holds 4.6 GB of them).
    """
    if spec is None:
        spec = ArchitectureSpec("text", num_classes=10, vocab_size=50, max_length=512) if text else mnist_spec()
    labels = (*epochs, "best" if spec.modality == "text" else "best1")
    if checkpoints is not None:
        if checkpoints < 1:
            raise ValueError(f"checkpoints must be at least 1, not {checkpoints}")
        runs = -(-checkpoints // len(labels))
    remaining = checkpoints if checkpoints is not None else runs * len(labels)
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)
    dataset, top = ("ag_news", "AG-News-Transformers") if spec.modality == "text" else ("mnist", "MNIST-Transformers")
    release = SyntheticRelease(Path(folder) / top, Path(folder) / top / "metadata" / f"{dataset}.csv")
    (release.top / dataset).mkdir(parents=True, exist_ok=True)
    release.csv_path.parent.mkdir(parents=True, exist_ok=True)
    positions = sinusoidal_positions(spec.num_tokens, spec.d_model)
    if spec.modality == "text":
        table = torch.randn(spec.vocab_size, spec.d_model, generator=generator)
        table[0] = 0
        torch.save({"embedding.embedding.weight": table, "embedding.pos_embedding": positions[None]},
                   release.top / dataset / "embedding.pt")
    names = original_names(spec)
    columns = TEXT_COLUMNS if spec.modality == "text" else VISION_COLUMNS
    accuracy_column = "test_accuracy" if spec.modality == "text" else "test_top1_accuracy"
    with open(release.csv_path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow([*columns, "ckpt_epoch", "ckpt_file", accuracy_column])
        for r in range(runs):
            run = "".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz0123456789"), size=8))
            config = _config(spec, dataset, r, rng)
            run_labels = labels[:min(len(labels), remaining)]
            remaining -= len(run_labels)
            if learnable:
                params, targets = shifted_bias_weights(spec, len(run_labels), seed * 1_000_003 + r)
                stacked = TransformerWeights.from_params(params, spec)
            for i, label in enumerate(run_labels):
                if learnable:
                    # clones, not views: torch.save writes a view's whole storage
                    state = {k: v.clone() for k, v in stacked.state_dict(i).items()}
                    accuracy = round(0.05 + 0.94 * float(targets[i]), 4)
                else:
                    state = _random_state(spec, generator)
                    accuracy = round(float(rng.uniform(0.05, 0.99)), 4)
                file_name = f"{run}_{label}_{int(accuracy * 10000)}.pt"
                saved = {names[k]: v for k, v in state.items()}
                if spec.modality == "vision":
                    saved["embedding.pos_embedding"] = positions[None]
                torch.save(saved, release.top / dataset / file_name)
                ckpt_file = (f"{dataset}/./model/{dataset}/{file_name}" if label.startswith("best")
                             else f"{dataset}/{file_name}")
                writer.writerow([config[c] for c in columns] + [label, ckpt_file, accuracy])
                release.accuracies[file_name] = accuracy
                if keep_weights:
                    release.weights[file_name] = state
    return release


def _random_state(spec: ArchitectureSpec, generator: torch.Generator) -> dict[str, torch.Tensor]:
    model = ZooTransformer(spec)
    for parameter in model.parameters():
        torch.nn.init.normal_(parameter, std=0.2, generator=generator)
    return {name: value.clone() for name, value in model.state_dict().items()}


def _config(spec: ArchitectureSpec, dataset: str, r: int, rng: np.random.Generator) -> dict[str, object]:
    return {"epochs": 100, "batch_size": 128, "n_workers": 4, "lr": float(10 ** rng.uniform(-4, -2)),
            "warmup_epochs": 0, "optimizer": OPTIMIZERS[r % 4], "w_init_std": float(rng.choice([0.05, 0.2, 0.5])),
            "l2_regularize": float(rng.choice([1e-8, 1e-6, 1e-4])), "train_fraction": float(rng.choice([0.5, 1.0])),
            "dropout": float(rng.choice([0.0, 0.1])), "seed": 0, "dataset": dataset, "image_size": spec.image_size,
            "patch_size": spec.patch_size, "n_channels": spec.in_channels, "max_len": spec.max_length,
            "embed_dim": spec.d_model, "n_attention_heads": spec.num_heads, "forward_mul": spec.d_mlp // spec.d_model,
            "n_layers": spec.num_blocks, "n_classes": spec.num_classes, "model_path": "./model",
            "data_path": "./data/"}
