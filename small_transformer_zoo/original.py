"""Import of the original release layout into this format (`stz import-original`).

The original zoo is a folder with `metadata/<name>.csv` and one `torch.save` state_dict per checkpoint, named
`<run>_<epoch>_<acc>.pt` with epoch a number, `best` or `best1`. The CSV has one row per run (or per checkpoint,
when it has an `epoch` column) with the hyperparameters and the test accuracy (`test_top1_accuracy` for MNIST,
`test_accuracy` for AG News). The original recorded no validation accuracy, no seed and no best-epoch number: those
stay null (epoch -1 for `best`/`best1`). Tensors are matched by name, or else by order and shape.
"""

from __future__ import annotations

import csv
import math
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .architecture import ArchitectureSpec
from .errors import ZooFormatError
from .writer import ZooWriter

FILE_PATTERN = re.compile(r"^(?P<run>.+)_(?P<epoch>\d+|best1?|best)_(?P<acc>[0-9.]+(?:[eE]-?\d+)?)\.pt$")
ACCURACY_COLUMNS = ("test_top1_accuracy", "test_accuracy")
RUN_COLUMNS = ("run_id", "run", "id", "model_id", "name")
ALIASES = {
    "optimizer": ("optimizer", "optim", "opt"),
    "learning_rate": ("learning_rate", "lr"),
    "dropout": ("dropout", "dropout_rate"),
    "w_init_std": ("w_init_std", "init_std", "winit_std"),
    "l2": ("l2", "l2_reg", "weight_decay"),
    "train_fraction": ("train_fraction", "train_frac"),
}
UNKNOWN_EPOCH = -1


def parse_checkpoint_name(name: str) -> tuple[str, str, float]:
    """`<run>_<epoch>_<acc>.pt` -> (run, epoch label, accuracy as a fraction)."""
    match = FILE_PATTERN.match(name)
    if not match:
        raise ZooFormatError(name, "file name is not <run>_<epoch>_<acc>.pt (epoch a number, best or best1)")
    return match.group("run"), match.group("epoch"), _fraction(match.group("acc"), name)


def _fraction(text: Any, where: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ZooFormatError(where, f"accuracy {text!r} is not a number") from None
    if not math.isfinite(value) or value < 0 or value > 100:
        raise ZooFormatError(where, f"accuracy {text!r} is neither a fraction nor a percentage")
    return value / 100.0 if value > 1.0 else value


def _column(header: list[str], names: tuple[str, ...]) -> str | None:
    lowered = {h.strip().lower(): h for h in header}
    return next((lowered[n] for n in names if n in lowered), None)


def read_original_csv(path: Path) -> tuple[dict[tuple[str, str | None], dict[str, Any]], bool]:
    """Rows keyed by (run, epoch label or None); True when rows are per checkpoint."""
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        header = reader.fieldnames or []
        run_col = _column(header, RUN_COLUMNS)
        if run_col is None:
            raise ZooFormatError(path, f"no run id column (one of {list(RUN_COLUMNS)}); columns are {header}")
        acc_col = _column(header, ACCURACY_COLUMNS)
        epoch_col = _column(header, ("epoch",))
        columns = {field: _column(header, names) for field, names in ALIASES.items()}
        rows: dict[tuple[str, str | None], dict[str, Any]] = {}
        for line, record in enumerate(reader, start=2):
            where = f"{path}:{line}"
            row: dict[str, Any] = {}
            for field, col in columns.items():
                if col is not None and record.get(col) not in (None, ""):
                    row[field] = record[col] if field == "optimizer" else _number(record[col], where, col)
            if acc_col is not None and record.get(acc_col) not in (None, ""):
                row["test_accuracy"] = _fraction(record[acc_col], f"{where} column {acc_col!r}")
            key = (str(record[run_col]), str(record[epoch_col]) if epoch_col else None)
            if key in rows:
                raise ZooFormatError(path, f"line {line}: run {key[0]!r} appears twice")
            rows[key] = row
    return rows, epoch_col is not None


def _number(text: str, where: str, column: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ZooFormatError(where, f"column {column!r}: {text!r} is not a number") from None


def map_state_dict(state: dict[str, torch.Tensor], spec: ArchitectureSpec, where: str) -> dict[str, torch.Tensor]:
    """Our names for an original state_dict: by name when they agree, else by order with every shape checked."""
    layout = spec.parameters()
    if {p.name for p in layout} <= set(state):
        return {p.name: state[p.name] for p in layout}
    tensors = [(k, v) for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if len(tensors) != len(layout):
        raise ZooFormatError(where, f"holds {len(tensors)} float tensors, the architecture has {len(layout)} "
                                    f"parameters; first names seen: {[k for k, _ in tensors[:4]]}")
    out = {}
    for (key, value), info in zip(tensors, layout):
        if tuple(value.shape) != info.shape:
            raise ZooFormatError(where, f"tensor {key!r} has shape {tuple(value.shape)}, expected {info.shape} "
                                        f"for {info.name!r} at the same position")
        out[info.name] = value
    return out


def import_original(source: str | os.PathLike[str], out_root: str | os.PathLike[str], config: str,
                    spec: ArchitectureSpec, *, metadata_name: str | None = None,
                    progress: Callable[[int, int], None] | None = None, **writer_kwargs: Any) -> dict[str, Any]:
    """Convert an original-layout folder into `<out_root>/<config>`; returns the manifest."""
    source = Path(source)
    csv_files = sorted((source / "metadata").glob("*.csv"))
    if metadata_name:
        csv_files = [p for p in csv_files if p.stem == metadata_name]
    if len(csv_files) != 1:
        raise ZooFormatError(source / "metadata", f"expected one metadata CSV{f' named {metadata_name}' if metadata_name else ''}, "
                                                  f"found {[p.name for p in csv_files]}")
    rows, per_checkpoint = read_original_csv(csv_files[0])
    files = sorted(p for p in source.rglob("*.pt") if "metadata" not in p.parts)
    if not files:
        raise ZooFormatError(source, "no .pt checkpoint files found")
    parsed = [(path, *parse_checkpoint_name(path.name)) for path in files]
    runs = {run for _, run, _, _ in parsed}
    missing = sorted(run for run in runs if not any(key[0] == run for key in rows))
    if missing:
        raise ZooFormatError(csv_files[0], f"{len(missing)} runs have checkpoints but no metadata row, first: {missing[:3]}")
    writer = ZooWriter(out_root, config, spec, task={"name": config, "source": "original release import"},
                       provenance={"imported_from": str(source.resolve()), "metadata_csv": csv_files[0].name},
                       **writer_kwargs)
    for done, (path, run, epoch_label, file_accuracy) in enumerate(parsed, start=1):
        meta = dict(rows.get((run, epoch_label if per_checkpoint else None), {}))
        if per_checkpoint and (run, epoch_label) not in rows:
            raise ZooFormatError(csv_files[0], f"no row for run {run!r} epoch {epoch_label!r} (file {path.name})")
        if not per_checkpoint and epoch_label != "best":
            meta.pop("test_accuracy", None)  # a per-run accuracy describes the best checkpoint only
        meta.setdefault("test_accuracy", file_accuracy)
        numeric = epoch_label.isdigit()
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # torch raises many types for damaged files
            first_line = (str(exc).splitlines() or [""])[0]
            raise ZooFormatError(path, f"cannot be read by torch.load ({type(exc).__name__}: {first_line})") from None
        if isinstance(state, dict) and "state_dict" in state:
            state = state["state_dict"]
        weights = map_state_dict(state, spec, str(path))
        writer.add(weights, {**meta, "run_id": run, "epoch": int(epoch_label) if numeric else UNKNOWN_EPOCH,
                             "is_best": epoch_label == "best",
                             "checkpoint_id": f"{run}-{'e%03d' % int(epoch_label) if numeric else epoch_label}"})
        if progress:
            progress(done, len(parsed))
    return writer.close()
