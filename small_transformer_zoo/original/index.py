"""The release's CSV as the import's index: one row per checkpoint, checked against its file name.

The CSV has no run-id column: the columns are the run's training config, `ckpt_epoch`, `ckpt_file` and the test
accuracy. The run id, the epoch label and the accuracy (`int(accuracy * 10000)`) are also in the file name
`<run>_<epoch>_<acc>.pt`; a row whose file name disagrees with its own columns is refused, so nothing is
imported under the wrong label.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from dataclasses import dataclass
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

from ..errors import ZooDamagedError
from ..format.metadata import checkpoint_id_for

FILE_NAME = re.compile(r"^(?P<run>[A-Za-z0-9]+)_(?P<epoch>\d+|best1?)_(?P<acc>\d+)\.pt$")
ACCURACY_COLUMNS = ("test_top1_accuracy", "test_accuracy")
REQUIRED_COLUMNS = ("ckpt_file", "ckpt_epoch")
# This format's typed columns and the release's names for them; every other column goes to `run_config`.
TYPED_COLUMNS = {"optimizer": ("optimizer",), "learning_rate": ("lr", "learning_rate"), "dropout": ("dropout",),
                 "w_init_std": ("w_init_std",), "l2": ("l2_regularize", "l2"), "train_fraction": ("train_fraction",),
                 "seed": ("seed",)}
BEST_EPOCH = -1  # the release does not record which epoch its best checkpoint came from


@dataclass(frozen=True)
class IndexRow:
    """One CSV row: its line, the checkpoint file it names, and its metadata in this format's columns."""

    line: int
    file_name: str
    metadata: dict[str, Any]


def parse_checkpoint_name(name: str) -> tuple[str, str, int]:
    """`<run>_<epoch>_<acc>.pt` -> (run id, epoch label, accuracy x 10,000 as an integer)."""
    match = FILE_NAME.match(name)
    if not match:
        raise ZooDamagedError(name, "file name is not <run>_<epoch>_<acc>.pt (run letters and digits, epoch a "
                                   "number, best or best1, acc = int(accuracy * 10000))")
    return match["run"], match["epoch"], int(match["acc"])


def config_value(text: str) -> Any:
    """A CSV cell as JSON: int, float, bool or null where it reads as one, else the string as written."""
    if text == "":
        return None
    if text in ("True", "False"):
        return text == "True"
    for kind in (int, float):
        try:
            value = kind(text)
        except ValueError:
            continue
        return value if math.isfinite(value) else text
    return text


def read_index(data: bytes, where: str) -> tuple[list[IndexRow], dict[str, set[Any]]]:
    """Rows of the release CSV (bytes of `where`), and every value each config column takes."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ZooDamagedError(where, f"not UTF-8 text ({exc})") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = [h for h in (reader.fieldnames or []) if h]
    accuracy = next((c for c in ACCURACY_COLUMNS if c in header), None)
    missing = [c for c in REQUIRED_COLUMNS if c not in header] + ([] if accuracy else [" or ".join(ACCURACY_COLUMNS)])
    if missing:
        raise ZooDamagedError(where, f"lacks columns {missing}; its columns are {header}")
    typed = {field: next((c for c in names if c in header), None) for field, names in TYPED_COLUMNS.items()}
    rest = [c for c in header if c != accuracy and c not in typed.values()]
    rows, by_file, by_id = [], {}, {}
    values: dict[str, set[Any]] = {c: set() for c in rest}
    for line, record in enumerate(reader, start=2):
        row = _row(record, line, where, accuracy, typed, rest)
        for column in rest:
            values[column].add(config_value(record.get(column) or ""))
        for seen, key in ((by_file, row.file_name), (by_id, row.metadata["checkpoint_id"])):
            if key in seen:
                raise ZooDamagedError(where, f"lines {seen[key]} and {line} both describe checkpoint {key!r}")
            seen[key] = line
        rows.append(row)
    if not rows:
        raise ZooDamagedError(where, "has no rows")
    return rows, values


def _row(record: dict[str, str], line: int, where: str, accuracy_column: str, typed: dict[str, str | None],
         rest: list[str]) -> IndexRow:
    here = f"{where}:{line}"
    if None in record:
        raise ZooDamagedError(here, "has more cells than the header has columns")
    file_name = PureWindowsPath(PurePosixPath(record["ckpt_file"]).name).name
    run, file_epoch, file_accuracy = parse_checkpoint_name(file_name)
    epoch_label = _epoch_label(record["ckpt_epoch"], here)
    if epoch_label != file_epoch:
        raise ZooDamagedError(here, f"ckpt_epoch {record['ckpt_epoch']!r} disagrees with its file {file_name!r}")
    accuracy = _number(record[accuracy_column], here, accuracy_column)
    if not 0.0 <= accuracy <= 1.0:
        raise ZooDamagedError(here, f"column {accuracy_column!r}: {record[accuracy_column]!r} is not a fraction in [0, 1]")
    if abs(accuracy * 10000 - file_accuracy) > 1.01:
        raise ZooDamagedError(here, f"column {accuracy_column!r}: {record[accuracy_column]!r} disagrees with the "
                                   f"accuracy {file_accuracy} / 10000 in its file name {file_name!r}")
    is_best = not epoch_label.isdigit()
    epoch = BEST_EPOCH if is_best else int(epoch_label)
    metadata: dict[str, Any] = {"run_id": run, "epoch": epoch, "is_best": is_best,
                                "checkpoint_id": checkpoint_id_for(run, epoch, is_best), "test_accuracy": accuracy}
    for field, column in typed.items():
        cell = record.get(column or "", "")
        if column is None or cell == "":
            continue
        if field == "optimizer":
            metadata[field] = cell
        elif field == "seed":
            seed = _number(cell, here, column)
            if seed != int(seed):
                raise ZooDamagedError(here, f"column {column!r}: {cell!r} is not an integer seed")
            metadata[field] = int(seed)
        else:
            metadata[field] = _number(cell, here, column)
    metadata["run_config"] = json.dumps({c: config_value(record.get(c) or "") for c in rest}, sort_keys=True)
    return IndexRow(line, file_name, metadata)


def _epoch_label(text: str, where: str) -> str:
    label = text.strip()
    if re.fullmatch(r"\d+(\.0+)?", label):
        return str(int(float(label)))
    if label in ("best", "best1"):
        return label
    raise ZooDamagedError(where, f"ckpt_epoch {text!r} is neither an epoch number nor best/best1")


def _number(text: str, where: str, column: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ZooDamagedError(where, f"column {column!r}: {text!r} is not a number") from None
    if not math.isfinite(value):
        raise ZooDamagedError(where, f"column {column!r}: {text!r} is not a finite number")
    return value
