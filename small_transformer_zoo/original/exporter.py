"""`stz export-original`: a zoo written in the authors' release layout (`original.layout`), so research code that
reads only that layout reads any zoo of this package.

Every checkpoint becomes one `.pt` state_dict with the original tensor names and shapes, and one CSV row: the run's
configuration in the original columns (values the zoo does not know are empty; an imported zoo's own columns come
back as the release wrote them; anything else the zoo records about a run, such as a built run's data and dropout
seeds, follows in columns of its own), the epoch as stored (`best1`/`best` for the best checkpoint), its file and
its test accuracy. Nothing is changed to fit a loader's filter. Splits whose labels are withheld (a leaderboard's
public copy) are left out whole, so no withheld label leaves. The release is written under a temporary name beside
the target and renamed into place (with `zip`, the zip is), so a failed export leaves nothing half-written.
"""

from __future__ import annotations

import csv
import hashlib
import json
import math
import os
import re
import shutil
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..errors import ZooArgumentError
from ..format.architecture import ArchitectureSpec
from ..store.reader import Zoo
from ..weights.model import sinusoidal_positions
from .checkpoints import POSITIONS, WORD_TABLE
from .layout import INDEX_COLUMNS, accuracy_column, best_label, config_columns, original_names, release_names
from .release import EMBEDDING_FILE

Progress = Callable[[int, int], None]
TYPED = {"lr": "learning_rate", "optimizer": "optimizer", "w_init_std": "w_init_std", "l2_regularize": "l2",
         "train_fraction": "train_fraction", "dropout": "dropout", "seed": "seed"}
ZOO_RUN_COLUMN = "stz_run_id"
BLOCK = 1024  # rows copied out of the shards at a time


@dataclass
class ExportResult:
    """What an export wrote: the release folder or zip, its checkpoints and runs, and what the user should know."""

    path: Path
    zoo: Path
    checkpoints: int
    runs: int
    notes: list[str] = field(default_factory=list)


def export_original(root: str | os.PathLike[str], config: str | None, out: str | os.PathLike[str], *,
                    as_zip: bool = False, overwrite: bool = False, progress: Progress | None = None) -> ExportResult:
    """Write zoo `root`/`config` (None: the root's only config) in the release layout under `out` (`out/<top>/`,
    or `out/<top>.zip` with `as_zip`); an existing target is an error unless `overwrite`. `progress(done, total)`
    follows the checkpoints."""
    out = Path(out)
    with Zoo.open(root, config) as zoo:
        task = str((zoo.manifest.get("task") or {}).get("name", zoo.config))
        dataset, top = release_names(task)
        target = out / (f"{top}.zip" if as_zip else top)
        if (target.exists() or target.is_symlink()) and not overwrite:
            raise ZooArgumentError(target, "already exists; pass --overwrite to replace it, or choose another --out")
        out.mkdir(parents=True, exist_ok=True)
        staging = out / f".{top}.export-{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            result = _write_release(zoo, staging / top, dataset, progress)
            if as_zip:
                _zip_folder(staging / top, staging / f"{top}.zip")
            _replace(staging / (f"{top}.zip" if as_zip else top), target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    result.path = target
    return result


def _write_release(zoo: Zoo, folder: Path, dataset: str, progress: Progress | None) -> ExportResult:
    spec = zoo.spec
    splits = [s for s in zoo.splits if not zoo.withheld(s)]
    notes = [f"split {s!r} is left out: its labels are withheld in this copy" for s in zoo.splits if s not in splits]
    tables = {s: zoo.metadata(s) for s in splits}
    total = sum(t.num_rows for t in tables.values())
    runs = sorted({r for t in tables.values() for r in t.column("run_id").to_pylist()})
    names = file_runs(runs)
    (folder / "metadata").mkdir(parents=True)
    (folder / dataset).mkdir()
    frozen = _frozen_tables(zoo, spec)
    defaults = _plan_columns(zoo, spec, dataset)
    rows, done, unlabelled = [], 0, 0
    if progress:
        progress(0, total)
    for split in splits:
        weights = zoo.split_weights(split)
        metadata = tables[split].to_pylist()
        for start in range(0, len(metadata), BLOCK):
            block = weights.rows(np.arange(start, min(start + BLOCK, len(metadata)))).numpy()
            for row, meta in zip(block, metadata[start:start + BLOCK]):
                accuracy = meta["test_accuracy"]
                if accuracy is None or not math.isfinite(accuracy):
                    unlabelled += 1
                    continue
                label = best_label(spec) if meta["is_best"] else str(meta["epoch"])
                file_name = f"{names[meta['run_id']]}_{label}_{int(accuracy * 10000)}.pt"
                torch.save(_state_dict(row, spec, frozen), folder / dataset / file_name)
                rows.append(_csv_row(meta, defaults, label, f"{dataset}/{file_name}"))
            done += len(block)
            if progress:
                progress(done, total)
    if spec.modality == "text":
        torch.save({WORD_TABLE: frozen[WORD_TABLE], POSITIONS: frozen[POSITIONS]}, folder / dataset / EMBEDDING_FILE)
    if unlabelled:
        notes.append(f"{unlabelled} checkpoints without a test accuracy are left out (the layout needs one)")
    _write_csv(folder / "metadata" / f"{dataset}.csv", rows, spec)
    return ExportResult(folder, zoo.dir, len(rows), len({r[ZOO_RUN_COLUMN] for r in rows}), notes)


def file_runs(run_ids: list[str]) -> dict[str, str]:
    """Each run id as the layout's run name (letters and digits only): the id without its other characters, with
    a short hash of the id added wherever two ids would otherwise share a name."""
    plain = {run: re.sub(r"[^A-Za-z0-9]", "", run) or "run" for run in run_ids}
    counts: dict[str, int] = {}
    for name in plain.values():
        counts[name] = counts.get(name, 0) + 1
    return {run: name if counts[name] == 1 else name + hashlib.sha256(run.encode()).hexdigest()[:10]
            for run, name in plain.items()}


def _frozen_tables(zoo: Zoo, spec: ArchitectureSpec) -> dict[str, torch.Tensor]:
    """The fixed tables every checkpoint runs with: the zoo's own position table (an imported zoo keeps the
    release's) or the package's sinusoid, and a text zoo's word table."""
    extras = zoo.extras()
    positions = extras.get("positions", {}).get("table")
    frozen = {POSITIONS: torch.from_numpy(np.array(positions)) if positions is not None
              else sinusoidal_positions(spec.num_tokens, spec.d_model)}
    if spec.modality == "text":
        if "embedding" not in extras:
            raise ZooArgumentError(zoo.dir, "a text zoo without its word table (extras 'embedding') cannot be "
                                            "exported: the release's embedding.pt needs it")
        frozen[WORD_TABLE] = torch.from_numpy(np.array(extras["embedding"]["table"]))
    return frozen


def _state_dict(row: np.ndarray, spec: ArchitectureSpec, frozen: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One packed row as the original module's state_dict (each tensor its own storage, so `torch.save` writes
    that tensor alone)."""
    names = original_names(spec)
    state = {names[p.name]: torch.from_numpy(np.array(row[p.offset:p.offset + p.numel])).view(p.shape)
             for p in spec.parameters()}
    if spec.modality == "vision":
        state[POSITIONS] = frozen[POSITIONS].clone()
    return state


def _plan_columns(zoo: Zoo, spec: ArchitectureSpec, dataset: str) -> dict[str, Any]:
    """The configuration columns that hold for every run of the zoo: its plan's and its architecture's."""
    plan = (zoo.manifest.get("provenance") or {}).get("build_plan") or {}
    epochs = plan.get("epochs")
    common: dict[str, Any] = {"epochs": epochs, "batch_size": plan.get("batch_size"), "dataset": dataset,
                              "embed_dim": spec.d_model, "n_attention_heads": spec.num_heads,
                              "forward_mul": spec.d_mlp // spec.d_model, "n_layers": spec.num_blocks,
                              "n_classes": spec.num_classes}
    if isinstance(epochs, int):
        common["warmup_epochs"] = max(1, round(epochs * 0.1))
    if spec.modality == "vision":
        common |= {"image_size": spec.image_size, "patch_size": spec.patch_size, "n_channels": spec.in_channels}
    else:
        common["max_len"] = spec.max_length
    return common


def _csv_row(meta: dict[str, Any], defaults: dict[str, Any], label: str, ckpt_file: str) -> dict[str, Any]:
    """A checkpoint's CSV row: the zoo's plan, the run's hyperparameters and whatever its `run_config` records."""
    row = dict(defaults)
    recorded = json.loads(meta["run_config"]) if meta.get("run_config") else {}
    row |= {k: v for k, v in recorded.items() if k not in INDEX_COLUMNS}
    row |= {column: meta[name] for column, name in TYPED.items() if meta.get(name) is not None}
    row |= {ZOO_RUN_COLUMN: meta["run_id"], "ckpt_epoch": label, "ckpt_file": ckpt_file,
            "_accuracy": meta["test_accuracy"]}
    return row


def _cell(value: Any) -> str:
    """A CSV cell the importer reads back as the same value: floats in their shortest exact form."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _write_csv(path: Path, rows: list[dict[str, Any]], spec: ArchitectureSpec) -> None:
    known = config_columns(spec)
    extra = sorted({k for row in rows for k in row} - set(known) - set(INDEX_COLUMNS) - {"_accuracy"})
    header = [*known, *extra, *INDEX_COLUMNS, accuracy_column(spec)]
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        for row in rows:
            writer.writerow([_cell(row.get(c)) for c in header[:-1]] + [_cell(row["_accuracy"])])


def _zip_folder(folder: Path, path: Path) -> None:
    """The release folder as a zip with its top folder, as the Hub ships it (members stored: `.pt` files are
    zip archives themselves)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for file in sorted(folder.rglob("*")):
            if file.is_file():
                archive.write(file, str(Path(folder.name) / file.relative_to(folder)))


def _replace(source: Path, target: Path) -> None:
    """Move the finished export into place; an old target (`overwrite`) goes only once the new one is whole."""
    if target.exists() or target.is_symlink():
        old = target.with_name(f".{target.name}.replaced-{os.getpid()}")
        target.rename(old)
        source.rename(target)
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        else:
            old.unlink()
    else:
        source.rename(target)

