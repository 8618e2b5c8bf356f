"""Leaderboard scoring: validate a submission (`checkpoint_id, predicted_accuracy` for every checkpoint of a zoo
split, CSV or Parquet), score it with the benchmark's metrics, and keep a ranked results file.

Every problem with a submission raises `SubmissionError` naming the file and the offending rows or ids (the
first few and a count); nothing else escapes the reader, whatever bytes it is given (fuzz-tested).
"""

from __future__ import annotations

import csv
import io
import json
import math
import multiprocessing
import os
import re
import stat
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from small_transformer_zoo import Zoo, as_zoo
from small_transformer_zoo.errors import DataError
from small_transformer_zoo.store.files import atomic_write_bytes

from .metrics import DEFAULT_THRESHOLDS, defined, scores
from .parquet_child import read_columns

COLUMNS = ("checkpoint_id", "predicted_accuracy")
SHOW = 5
MAX_BYTES = 256 << 20     # a submission for 125,000 checkpoints is a few MB
MAX_ROWS = 5_000_000
NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:nan|inf|infinity)", re.ASCII | re.I)


class SubmissionError(DataError):
    """A submission that cannot be scored; the message says which file, rows or ids, and why."""


def _few(items: list[Any]) -> str:
    shown = ", ".join(repr(i) for i in items[:SHOW])
    return f"{shown}{' ...' if len(items) > SHOW else ''} ({len(items)} in all)"


def _read_bytes(path: Path) -> bytes:
    """A submission's bytes: a regular file (a FIFO or device never blocks or floods the scorer) within the limit."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise SubmissionError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SubmissionError(f"{path}: not a regular file (a folder, FIFO or device); submit a CSV or Parquet file")
        with os.fdopen(os.dup(fd), "rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_BYTES:
        raise SubmissionError(f"{path}: larger than the {MAX_BYTES:,} bytes a submission may have")
    return raw


def _read_parquet(path: Path, raw: bytes) -> tuple[list[Any], list[Any]]:
    """The two columns of a Parquet submission, parsed in a child process (see `parquet_child`)."""
    context = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(1, mp_context=context) as pool:
            status, found = pool.submit(read_columns, raw, COLUMNS, MAX_ROWS, MAX_BYTES).result()
    except BrokenProcessPool:
        raise SubmissionError(f"{path}: not a readable Parquet file (the Parquet reader crashed on it)") from None
    if status == "error":
        raise SubmissionError(f"{path}: {found}")
    if status == "columns":
        _check_columns(path, found)
    return [None if v is None else str(v) for v in found["checkpoint_id"]], found["predicted_accuracy"]


def _read_table(path: Path) -> tuple[list[str], list[Any], str]:
    """Raw ids and prediction cells, with a description of where row numbers start."""
    raw = _read_bytes(path)
    if not raw.strip():
        raise SubmissionError(f"{path}: the file is empty")
    if raw[:4] == b"PAR1" or path.suffix.lower() == ".parquet":
        ids, values = _read_parquet(path, raw)
        return ids, values, "Parquet row"
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise SubmissionError(f"{path}: neither CSV (UTF-8 text) nor Parquet") from None
    try:
        rows = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        raise SubmissionError(f"{path}: not valid CSV ({exc})") from None
    rows = [r for r in rows if any(cell.strip() for cell in r)]
    if not rows:
        raise SubmissionError(f"{path}: the file is empty")
    if len(rows) - 1 > MAX_ROWS:
        raise SubmissionError(f"{path}: {len(rows) - 1:,} rows, more than the {MAX_ROWS:,} a submission may have")
    header = [h.strip() for h in rows[0]]
    _check_columns(path, header)
    id_col, value_col = header.index("checkpoint_id"), header.index("predicted_accuracy")
    short = [i for i, r in enumerate(rows[1:], start=2) if len(r) != len(header)]
    if short:
        raise SubmissionError(f"{path}: lines whose number of cells differs from the header's {len(header)}: "
                              f"lines {_few(short)}")
    return [r[id_col].strip() for r in rows[1:]], [r[value_col].strip() for r in rows[1:]], "CSV line"


def _check_columns(path: Path, columns: list[str]) -> None:
    missing = [c for c in COLUMNS if c not in columns]
    extra = [c for c in columns if c not in COLUMNS]
    if missing or extra or len(columns) != len(set(columns)):
        raise SubmissionError(f"{path}: columns must be exactly {list(COLUMNS)}; found {columns}"
                              f"{f', missing {missing}' if missing else ''}{f', unexpected {extra}' if extra else ''}")


def read_submission(path: str | os.PathLike[str]) -> tuple[list[str], np.ndarray]:
    """Checked ids and finite float predictions of a CSV or Parquet submission."""
    path = Path(path)
    ids, cells, unit = _read_table(path)
    offset = 2 if unit == "CSV line" else 0
    if not ids:
        raise SubmissionError(f"{path}: no rows after the header")
    blank = [i + offset for i, v in enumerate(ids) if not v]
    if blank:
        raise SubmissionError(f"{path}: empty checkpoint_id at {unit}s {_few(blank)}")
    values, bad = np.empty(len(cells)), []
    for i, cell in enumerate(cells):
        number = _number(cell)
        if number is None:
            bad.append(i + offset)
            continue
        values[i] = number
    if bad:
        raise SubmissionError(f"{path}: predicted_accuracy is not a number at {unit}s {_few(bad)}")
    not_finite = [i + offset for i in np.nonzero(~np.isfinite(values))[0].tolist()]
    if not_finite:
        raise SubmissionError(f"{path}: predicted_accuracy is NaN or infinite at {unit}s {_few(not_finite)}")
    outside = [i + offset for i in np.nonzero((values < 0.0) | (values > 1.0))[0].tolist()]
    if outside:
        raise SubmissionError(f"{path}: predicted_accuracy is outside [0, 1] at {unit}s {_few(outside)}")
    seen: dict[str, int] = {}
    duplicates = []
    for cid in ids:
        seen[cid] = seen.get(cid, 0) + 1
        if seen[cid] == 2:
            duplicates.append(cid)
    if duplicates:
        raise SubmissionError(f"{path}: checkpoint ids given more than once: {_few(duplicates)}")
    return ids, values


def _number(cell: Any) -> float | None:
    """A prediction cell as a float: a real number, or an ASCII decimal string (no other digits, no words)."""
    if isinstance(cell, bool) or cell is None:
        return None
    if isinstance(cell, (int, float)):
        return float(cell)
    if isinstance(cell, str) and NUMBER.fullmatch(cell):
        return float(cell)
    return None


def check_submission(path: str | os.PathLike[str], zoo: Zoo, split: str) -> tuple[list[str], np.ndarray,
                                                                                np.ndarray | None]:
    """A submission's ids and predictions, checked against a zoo split (every id once, no unknown id), with the
    true accuracies in the same order, or None where this copy of the zoo withholds them."""
    ids, predicted = read_submission(path)
    meta = zoo.metadata(split).take(zoo.select(split))
    known = set(meta.column("checkpoint_id").to_pylist())
    given = set(ids)
    unknown = [cid for cid in ids if cid not in known]
    missing = [cid for cid in meta.column("checkpoint_id").to_pylist() if cid not in given]
    if unknown:
        raise SubmissionError(f"{path}: ids that are not checkpoints of {zoo.config}/{split}: {_few(unknown)}")
    if missing:
        raise SubmissionError(f"{path}: {zoo.config}/{split} checkpoints with no prediction: {_few(missing)}")
    if "test_accuracy" in zoo.withheld(split):
        return ids, predicted, None
    truth = dict(zip(meta.column("checkpoint_id").to_pylist(), meta.column("test_accuracy").to_pylist()))
    return ids, predicted, np.asarray([truth[cid] for cid in ids], dtype=float)


def score_submission(path: str | os.PathLike[str], zoo: Zoo | str | os.PathLike[str], config: str | None = None,
                     split: str = "test", thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS) -> dict[str, Any]:
    """Validate a submission against a zoo split and score it; the zoo (a Zoo, or a local or Hub root) must hold
    the split's labels."""
    zoo = as_zoo(zoo, config)
    config = zoo.config
    _, predicted, true = check_submission(path, zoo, split)
    if true is None:
        raise SubmissionError(f"{zoo.dir}: the labels of {config}/{split} are withheld in this copy of the zoo; "
                              f"the leaderboard's maintainers score it against their full copy")
    return scores(predicted, true, thresholds)


def write_submission(path: str | os.PathLike[str], ids: list[str], predicted: np.ndarray) -> Path:
    """A submission CSV, as our own models hand theirs to the scorer."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COLUMNS)
        writer.writerows(zip(ids, (f"{v:.8g}" for v in predicted)))
    return path


def add_result(leaderboard: str | os.PathLike[str], name: str, config: str, split: str,
               metrics: dict[str, Any], source: str) -> None:
    """Append (or replace, by name, config and split) one entry of the results file."""
    path = Path(leaderboard)
    atomic_write_bytes(path, results_bytes(with_result(load_leaderboard(path), name, config, split, metrics,
                                                       source)))


def with_result(entries: list[dict[str, Any]], name: str, config: str, split: str, metrics: dict[str, Any],
                source: str) -> list[dict[str, Any]]:
    """The entries with one added, replacing any of the same name, config and split."""
    kept = [e for e in entries if (e["name"], e["config"], e["split"]) != (name, config, split)]
    return kept + [{"name": name, "config": config, "split": split, "metrics": defined(metrics), "source": source,
                    "scored_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}]


def results_bytes(entries: list[dict[str, Any]]) -> bytes:
    """A results file's bytes: strict JSON (no NaN or infinity tokens)."""
    document = {"format": "stz-leaderboard", "version": 1, "entries": entries}
    return (json.dumps(document, indent=2, allow_nan=False) + "\n").encode()


def load_leaderboard(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    path = Path(path)
    if not path.exists():
        return []
    return parse_leaderboard(path.read_bytes(), str(path))


def parse_leaderboard(raw: bytes, where: str) -> list[dict[str, Any]]:
    """The entries of a results file; anything else is a SubmissionError naming `where`."""
    try:
        data = json.loads(raw)
        entries = list(data["entries"])
    except (ValueError, KeyError, TypeError) as exc:
        raise SubmissionError(f"{where}: not a leaderboard results file ({exc})") from None
    keys = ("name", "config", "split", "metrics")
    if not all(isinstance(e, dict) and all(k in e for k in keys) and isinstance(e["metrics"], dict) for e in entries):
        raise SubmissionError(f"{where}: not a leaderboard results file (an entry lacks one of {list(keys)})")
    return entries


def render_leaderboard(entries: list[dict[str, Any]], thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS) -> str:
    """Ranked Markdown tables, one per zoo config and split, best Kendall's tau first; "-" where a metric is not
    defined (null: fewer than two checkpoints above a threshold)."""
    out = []
    for key in sorted({(e["config"], e["split"]) for e in entries}):
        rows = sorted((e for e in entries if (e["config"], e["split"]) == key), key=lambda e: -_finite(e["metrics"]["tau"]))
        header = ["rank", "name", "tau"] + [f"tau >= {t:g}" for t in thresholds] + ["R^2", "L1"]
        out += [f"### {markdown_text(str(key[0]))} / {markdown_text(str(key[1]))}", "",
                "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for rank, e in enumerate(rows, start=1):
            m = e["metrics"]
            cells = [m["tau"]] + [m.get(f"tau@{t:g}") for t in thresholds] + [m["r2"], m["l1"]]
            out.append(f"| {rank} | {markdown_text(str(e['name']))} | "
                       + " | ".join("-" if not math.isfinite(_finite(c)) else f"{c:.3f}" for c in cells) + " |")
        out.append("")
    return "\n".join(out)


def _finite(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else -math.inf


def markdown_text(text: str) -> str:
    """Text shown as itself in a Markdown table cell: no markup, links, HTML or cell breaks."""
    flat = " ".join(text.split())
    return re.sub(r"([\\`*_{}\[\]()<>#+!|~])", r"\\\1", flat)
