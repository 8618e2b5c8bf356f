"""Helpers that several test modules share: locating and rewriting zoo files, building small zoos, the real data
folder, small trained models for the symmetry tests, and the benchmark scripts imported as modules."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from builders.build import BuildRequest, run_build
from builders.trainer import Recipe
from small_transformer_zoo.format.architecture import ArchitectureSpec, text_spec
from small_transformer_zoo.weights.model import ZooTransformer

PROJECT = Path(__file__).resolve().parents[1]  # the repository root
SHARED_DATA = PROJECT.parent / "shared" / "data"
RUN_OPTIONS = ("dry_run", "progress", "executor", "log", "free_bytes")


def benchmark_script(name: str) -> ModuleType:
    """A script of `benchmarks/` imported as a module, its folder on the path only while it loads (its sibling
    imports resolve, and nothing stays behind for later tests)."""
    folder = str(PROJECT / "benchmarks")
    sys.path.insert(0, folder)
    try:
        spec = importlib.util.spec_from_file_location(name, PROJECT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(folder)
    return module


def quiet(*_: object) -> None:
    """A `log` that prints nothing."""
    return None


def build_zoo(task: str, preset: str, out: str | Path, **options: Any) -> dict[str, Any]:
    """`run_build` of a request for `task` and `preset` into `out`; `options` are the request's fields and
    `run_build`'s keywords (progress and log default to silent)."""
    run = {"progress": False, "log": quiet, **{k: options.pop(k) for k in RUN_OPTIONS if k in options}}
    return run_build(BuildRequest.of(task, preset, out, **options), **run)


def recipe(epochs: int, checkpoint_epochs: list[int], batch_size: int = 128, augment: bool = True,
           precision: str = "fp32") -> Recipe:
    """The paper's recipe (batches of 128, crops) for a few epochs, as the trainer tests use it."""
    return Recipe(epochs, tuple(checkpoint_epochs), batch_size, augment, precision)


def shared_data(name: str) -> Path:
    path = SHARED_DATA / name
    if not path.exists():
        pytest.skip(f"real data {path} is absent (../shared/data is only laid out beside the project checkout)")
    return path


def metadata_file(config_dir: Path, split: str) -> Path:
    """The metadata file of a split, as the manifest names it (data file names carry a content hash)."""
    manifest = json.loads((config_dir / "zoo.json").read_text())
    return config_dir / manifest["metadata"][split]["path"]


def shard_file(config_dir: Path, split: str, index: int = 0) -> Path:
    """The `index`-th weight shard of a split, as the manifest names it."""
    manifest = json.loads((config_dir / "zoo.json").read_text())
    return config_dir / [s for s in manifest["shards"] if s["split"] == split][index]["path"]


def rewrite_metadata(config_dir: Path, split: str, table: pa.Table) -> None:
    """Replace a split's metadata and give the manifest its new size and sha256, as a tool that writes a
    consistent but wrong zoo would."""
    path = metadata_file(config_dir, split)
    pq.write_table(table, path)
    manifest = json.loads((config_dir / "zoo.json").read_text())
    info = manifest["metadata"][split]
    info["bytes"], info["sha256"] = path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest()
    info["rows"] = table.num_rows
    (config_dir / "zoo.json").write_text(json.dumps(manifest))


TEXT = text_spec(vocab_size=40, max_length=10)


def random_inputs(spec: ArchitectureSpec, count: int, generator: torch.Generator) -> torch.Tensor:
    """Random images (float64), or token ids with some texts padded, for a model of `spec`."""
    if spec.modality == "vision":
        return torch.randn(count, 1, 28, 28, generator=generator, dtype=torch.float64)
    ids = torch.randint(1, spec.vocab_size, (count, spec.max_length), generator=generator)
    ids[: count // 2, 6:] = 0  # some padded texts
    return ids


def briefly_trained(spec: ArchitectureSpec, seed: int = 0, steps: int = 30) -> ZooTransformer:
    """A zoo model trained a few Adam steps in float64 (weights away from their initialisation)."""
    generator = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = ZooTransformer(spec, dropout=0.1).double()
    if spec.modality == "text":
        model.embedding.table.copy_(torch.randn(spec.vocab_size, spec.d_model, generator=generator))
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(steps):
        x = random_inputs(spec, 32, generator)
        y = torch.randint(0, spec.num_classes, (32,), generator=generator)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval()


def transformed_copy(model: ZooTransformer, state: dict) -> ZooTransformer:
    other = ZooTransformer(model.spec).double().eval()
    other.load_state_dict(state)
    if model.spec.modality == "text":
        other.embedding.table.copy_(model.embedding.table)
    return other


HANG_TIMEOUT = 3600  # seconds: a bound on a subprocess that only catches a hang, never a slow or loaded machine


def hub_dataset(folder: Path, splits: dict[str, dict[str, list]], features: object | None = None) -> Path:
    """A Hub-style dataset repo (`data/<split>-00000-of-00001.parquet`, written by `datasets`)."""
    import datasets

    for split, columns in splits.items():
        path = folder / "data" / f"{split}-00000-of-00001.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        datasets.Dataset.from_dict(columns, features=features).to_parquet(str(path))
    return folder
