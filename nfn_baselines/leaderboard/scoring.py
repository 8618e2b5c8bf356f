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
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np
import pyarrow as pa

from small_transformer_zoo.errors import DataError, naming_file
from small_transformer_zoo.format.selection import normalise_where
from small_transformer_zoo.store.files import atomic_write_bytes, read_small_file, shared_file_update

from ..models.metrics import (BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, DEFAULT_THRESHOLDS, MIN_RUNS, RunResamples,
                              defined, paired_difference, percentile_interval, runs_behind, scores, too_few_runs)
from ..bench.protocols import protocol_where
from ..models.targets import TARGETS, Target, get_target
from .parquet_child import read_columns

ID_COLUMN = "checkpoint_id"
EVERY_CHECKPOINT = "every checkpoint"
SHOW = 5
MAX_BYTES = 64 << 20      # a submission for 125,000 checkpoints is a few MB
MAX_ROWS = 1_000_000
NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:nan|inf|infinity)", re.ASCII | re.I)


if TYPE_CHECKING:
    from small_transformer_zoo import Zoo


class SubmissionError(DataError):
    """A submission that cannot be scored; the message says which file, rows or ids, and why."""


def _few(items: list[Any]) -> str:
    shown = ", ".join(repr(i) for i in items[:SHOW])
    return f"{shown}{' ...' if len(items) > SHOW else ''} ({len(items)} in all)"


def _open_submission(path: Path) -> BinaryIO:
    """A submission opened for reading: a regular file (a FIFO or device never blocks or floods the scorer) within
    the size limit."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise SubmissionError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise SubmissionError(f"{path}: not a regular file (a folder, FIFO or device); submit a CSV or Parquet file")
    if st.st_size > MAX_BYTES:
        os.close(fd)
        raise SubmissionError(f"{path}: larger than the {MAX_BYTES:,} bytes a submission may have")
    return os.fdopen(fd, "rb")


def _read_parquet(path: Path, raw: bytes, columns: tuple[str, str]) -> tuple[list[Any], list[Any]]:
    """The two columns of a Parquet submission, parsed in a child process (see `parquet_child`)."""
    context = multiprocessing.get_context("spawn")
    try:
        with ProcessPoolExecutor(1, mp_context=context) as pool:
            status, found = pool.submit(read_columns, raw, columns, MAX_ROWS, MAX_BYTES).result()
    except BrokenProcessPool:
        raise SubmissionError(f"{path}: not a readable Parquet file (the Parquet reader crashed on it)") from None
    if status == "error":
        raise SubmissionError(f"{path}: {found}")
    if status == "columns":
        _check_columns(path, found, columns)
    return [None if v is None else str(v) for v in found[ID_COLUMN]], found[columns[1]]


class _Lines:
    """Line numbers of a kind of bad row: the first few kept, all counted (a file of a million bad rows costs
    no more memory than one)."""

    def __init__(self) -> None:
        self.first: list[int] = []
        self.count = 0

    def add(self, line: int) -> None:
        self.count += 1
        if len(self.first) <= SHOW:
            self.first.append(line)

    def text(self) -> str:
        shown = ", ".join(str(i) for i in self.first[:SHOW])
        return f"{shown}{' ...' if self.count > SHOW else ''} ({self.count} in all)"


def _read_csv(path: Path, handle: BinaryIO, columns: tuple[str, str]) -> tuple[list[str], list[Any]]:
    """The two columns of a CSV submission, read as a stream: blank lines skipped as they come, the row limit
    checked as rows arrive, only the two cells of each row kept."""
    reader = csv.reader(io.TextIOWrapper(handle, encoding="utf-8-sig", newline=""))
    header: list[str] | None = None
    ids: list[str] = []
    cells: list[Any] = []
    short = _Lines()
    line = 1
    try:
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue
            if header is None:
                header = [h.strip() for h in row]
                _check_columns(path, header, columns)
                id_col, value_col = header.index(ID_COLUMN), header.index(columns[1])
                continue
            line += 1
            if line - 1 > MAX_ROWS:
                raise SubmissionError(f"{path}: more than the {MAX_ROWS:,} rows a submission may have")
            if len(row) != len(header):
                short.add(line)
                continue
            ids.append(row[id_col].strip())
            cells.append(row[value_col].strip())
    except UnicodeDecodeError:
        raise SubmissionError(f"{path}: neither CSV (UTF-8 text) nor Parquet") from None
    except csv.Error as exc:
        raise SubmissionError(f"{path}: not valid CSV ({exc})") from None
    if header is None:
        raise SubmissionError(f"{path}: the file is empty")
    if short.count:
        raise SubmissionError(f"{path}: lines whose number of cells differs from the header's {len(header)}: "
                              f"lines {short.text()}")
    return ids, cells


def _read_table(path: Path, columns: tuple[str, str]) -> tuple[list[str], list[Any], str]:
    """Raw ids and prediction cells, with a description of where row numbers start."""
    try:
        with naming_file(path), _open_submission(path) as handle:
            start = handle.read(4)
            handle.seek(0)
            if start == b"PAR1" or path.suffix.lower() == ".parquet":
                raw = handle.read(MAX_BYTES + 1)
                if not raw.strip():
                    raise SubmissionError(f"{path}: the file is empty")
                ids, values = _read_parquet(path, raw, columns)
                return ids, values, "Parquet row"
            ids, values = _read_csv(path, handle, columns)
            return ids, values, "CSV line"
    except OSError as exc:  # a file that opens but cannot be read (/proc/self/mem: EIO), a disk that fails
        raise SubmissionError(f"{path}: cannot be read ({exc.strerror or exc}); give a regular file, a CSV or "
                              f"Parquet submission") from None


def _check_columns(path: Path, found: list[str], columns: tuple[str, str]) -> None:
    missing = [c for c in columns if c not in found]
    extra = [c for c in found if c not in columns]
    if missing or extra or len(found) != len(set(found)):
        raise SubmissionError(f"{path}: columns must be exactly {list(columns)}; found {found}"
                              f"{f', missing {missing}' if missing else ''}{f', unexpected {extra}' if extra else ''}")


def read_submission(path: str | os.PathLike[str], target: str = "test_accuracy") -> tuple[list[str], np.ndarray]:
    """Checked ids and predictions of a CSV or Parquet submission for `target` (column `predicted_<target>`):
    finite numbers within the target's range, or one of a class target's class names."""
    path = Path(path)
    chosen = get_target(target)
    column = chosen.submission_column
    ids, cells, unit = _read_table(path, (ID_COLUMN, column))
    offset = 2 if unit == "CSV line" else 0
    if not ids:
        raise SubmissionError(f"{path}: no rows after the header")
    blank = [i + offset for i, v in enumerate(ids) if not v]
    if blank:
        raise SubmissionError(f"{path}: empty checkpoint_id at {unit}s {_few(blank)}")
    values = _class_values(path, cells, unit, offset, chosen) if chosen.kind == "classification" else \
        _number_values(path, cells, unit, offset, chosen)
    seen: dict[str, int] = {}
    duplicates = []
    for cid in ids:
        seen[cid] = seen.get(cid, 0) + 1
        if seen[cid] == 2:
            duplicates.append(cid)
    if duplicates:
        raise SubmissionError(f"{path}: checkpoint ids given more than once: {_few(duplicates)}")
    return ids, values


def _number_values(path: Path, cells: list[Any], unit: str, offset: int, target: Target) -> np.ndarray:
    column = target.submission_column
    values, bad = np.empty(len(cells)), []
    for i, cell in enumerate(cells):
        number = _number(cell)
        if number is None:
            bad.append(i + offset)
            continue
        values[i] = number
    if bad:
        raise SubmissionError(f"{path}: {column} is not a number at {unit}s {_few(bad)}")
    not_finite = [i + offset for i in np.nonzero(~np.isfinite(values))[0].tolist()]
    if not_finite:
        raise SubmissionError(f"{path}: {column} is NaN or infinite at {unit}s {_few(not_finite)}")
    low, high = target.bounds
    outside = [i + offset for i in np.nonzero((values < low) | (values > high))[0].tolist()]
    if outside:
        raise SubmissionError(f"{path}: {column} is outside [{low:g}, {high:g}] at {unit}s {_few(outside)}")
    return values


def _class_values(path: Path, cells: list[Any], unit: str, offset: int, target: Target) -> np.ndarray:
    bad = [i + offset for i, cell in enumerate(cells) if not (isinstance(cell, str) and cell in target.classes)]
    if bad:
        raise SubmissionError(f"{path}: {target.submission_column} is not one of {list(target.classes)} at {unit}s "
                              f"{_few(bad)}")
    return np.asarray([target.classes.index(cell) for cell in cells], dtype=np.int64)


def _number(cell: Any) -> float | None:
    """A prediction cell as a float: a real number, or an ASCII decimal string (no other digits, no words)."""
    if isinstance(cell, bool) or cell is None:
        return None
    if isinstance(cell, (int, float)):
        return float(cell)
    if isinstance(cell, str) and NUMBER.fullmatch(cell):
        return float(cell)
    return None


@dataclass
class Truth:
    """What a submission is scored against: per checkpoint, in the submission's order, the target, the test
    accuracy (for thresholds) and the run (the unit of the bootstrap)."""

    target: np.ndarray
    accuracy: np.ndarray
    runs: list[str]


def check_submission(path: str | os.PathLike[str], zoo: Zoo, split: str, target: str = "test_accuracy",
                     where: Mapping[str, Any] | None = None) -> tuple[list[str], np.ndarray, Truth | None]:
    """A submission's ids and predictions, checked against a zoo split (every checkpoint of the split that
    `Zoo.select` picks with `where`, once; no other id), with the truth in the same order, or None where this copy
    of the zoo withholds the target."""
    chosen = get_target(target)
    ids, predicted = read_submission(path, target)
    meta = zoo.metadata(split).take(zoo.select(split, where=where))
    order = meta.column("checkpoint_id").to_pylist()
    known = set(order)
    given = set(ids)
    unknown = [cid for cid in ids if cid not in known]
    missing = [cid for cid in order if cid not in given]
    if unknown:
        repeated = set(zoo.metadata(split).column("checkpoint_id").to_pylist()) & set(unknown)
        note = (f" ({len(repeated)} of them repeat another checkpoint's weights or are diverged, and are scored "
                f"once, under the first id)" if repeated else "")
        raise SubmissionError(f"{path}: ids that are not checkpoints of {zoo.config}/{split}{_selected(where)}{note}: "
                              f"{_few(unknown)}")
    if missing:
        hint = ("; a submission for one checkpoint per run (stz bench --protocol paper) is scored with the same "
                "protocol (--protocol paper, and the bench's --epoch and --where)" if not where else "")
        raise SubmissionError(f"{path}: {zoo.config}/{split} checkpoints{_selected(where)} with no prediction: "
                              f"{_few(missing)}{hint}")
    if set(chosen.columns) & set(zoo.withheld(split)):
        return ids, predicted, None
    position = {cid: i for i, cid in enumerate(order)}
    take = pa.array([position[cid] for cid in ids])
    rows = meta.take(take)
    return ids, predicted, Truth(chosen.values(rows, f"{zoo.dir}/{split}"),
                                 rows.column("test_accuracy").to_numpy(zero_copy_only=False).astype(float),
                                 rows.column("run_id").to_pylist())


def _selected(where: Mapping[str, Any] | None) -> str:
    return f" (selected by {selection_text(normalise_where(where))})" if where else ""


def selection_text(conditions: list[Any]) -> str:
    """A selection's conditions (`normalise_where`'s triples) as one line: `epoch = 6, is_best = False`."""
    shown = {"eq": "= {}", "in": "in {}", "null": "is null", "range": "in [{}, {}]"}
    parts = []
    for column, op, value in conditions:
        values = value if op == "range" else [value]
        parts.append(f"{column} " + shown[op].format(*("-" if v is None else v for v in values)))
    return ", ".join(parts) or EVERY_CHECKPOINT


def score_values(predicted: np.ndarray, truth: Truth, target: str = "test_accuracy",
                 thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS, resamples: int = BOOTSTRAP_RESAMPLES,
                 bootstrap_seed: int = BOOTSTRAP_SEED) -> dict[str, Any]:
    """The benchmark's metrics of one set of predictions, each with its 95% interval from a bootstrap over the
    split's runs, the runs it rests on, and the main metric's value on every resample (so that entries scored on
    the same split compare, paired)."""
    from ..bench.report import metric_value

    chosen = get_target(target)
    classes = len(chosen.classes)
    if chosen.kind == "classification":
        columns = ["accuracy", "macro_f1"]
        probabilities = np.eye(classes)[predicted]
        out: dict[str, Any] = {"n": len(predicted)}
    else:
        columns = ["tau"] + [f"tau@{t:g}" for t in thresholds] + ["r2", "l1"]
        probabilities = predicted
        out = scores(predicted, truth.target, thresholds, truth.accuracy)
    draws = RunResamples.of(truth.runs, resamples, bootstrap_seed)
    everything = np.arange(len(predicted))
    intervals, main_values = {}, None
    for column in columns:
        value = lambda index: metric_value(column, probabilities, truth.target, truth.accuracy, index, classes)  # noqa: E731
        out[column] = value(everything)
        values = draws.values(value)
        intervals[column] = list(percentile_interval(values))
        main_values = values if main_values is None else main_values
    out.update(target=target, intervals=intervals, runs=draws.runs,
               column_runs={c: runs_behind(truth.runs, truth.accuracy, c) for c in columns},
               bootstrap={"resamples": resamples, "seed": bootstrap_seed, "unit": "test run"},
               main_resamples=[round(float(v), 6) if np.isfinite(v) else None for v in main_values])
    return out


def score_submission(path: str | os.PathLike[str], zoo: Zoo | str | os.PathLike[str], config: str | None = None,
                     split: str = "test", thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS,
                     target: str = "test_accuracy", *, protocol: str = "all-checkpoints", epoch: int | None = None,
                     where: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Validate a submission against the checkpoints of a zoo split that a benchmark protocol and `where` select
    (`protocols.protocol_where`, as `stz bench` selects them) and score it with its intervals (`score_values`);
    the selection is kept in the scores. The zoo (a Zoo, or a local or Hub root) must hold the split's labels."""
    from small_transformer_zoo.hub.opening import open_zoo  # here: reading a submission needs neither torch nor a zoo
    zoo = open_zoo(zoo, config)
    config = zoo.config
    selection, epoch = protocol_where(zoo, protocol, epoch, where)
    _, predicted, truth = check_submission(path, zoo, split, target, selection)
    if truth is None:
        raise SubmissionError(f"{zoo.dir}: the labels of {config}/{split} are withheld in this copy of the zoo; "
                              f"the leaderboard's maintainers score it against their full copy")
    out = score_values(predicted, truth, target, thresholds)
    if selection:
        out.update(protocol=protocol, epoch=epoch, selection=[list(c) for c in normalise_where(selection)])
    return out


def add_result(leaderboard: str | os.PathLike[str], name: str, config: str, split: str,
               metrics: dict[str, Any], source: str) -> None:
    """Append (or replace, by name, config, split and target) one entry of the results file. The file is read and
    written back under its lock, so concurrent writers of one results file each keep their entry."""
    path = results_path(leaderboard)
    with shared_file_update(path, f"adding {name!r} to the results"):
        atomic_write_bytes(path, results_bytes(with_result(load_leaderboard(path), name, config, split, metrics,
                                                           source)))


def results_path(leaderboard: str | os.PathLike[str]) -> Path:
    """Where a results file is written: through a symbolic link to the file it names (the link stays a link), and
    never over a folder."""
    path = Path(leaderboard)
    if path.is_symlink():
        path = path.resolve()
    if path.is_dir():
        raise SubmissionError(f"{path}: a folder; a leaderboard's results are one JSON file, e.g. "
                              f"{path / 'results.json'}")
    return path


def entry_target(entry: dict[str, Any]) -> str:
    """An entry's target (entries scored before there were other targets are for test accuracy)."""
    return str(entry["metrics"].get("target") or "test_accuracy")


def entry_selection(entry: dict[str, Any]) -> str:
    """The checkpoints an entry was scored on, in words (entries scored on all of a split's have none stored)."""
    conditions = entry["metrics"].get("selection") or []
    try:
        return selection_text(conditions)
    except (TypeError, ValueError, KeyError, IndexError):  # a results file from elsewhere: shown, never trusted
        return json.dumps(conditions)


def table_key(entry: dict[str, Any]) -> tuple[str, str, str, str]:
    """Entries rank against each other only when scored on the same checkpoints for the same target."""
    return str(entry["config"]), str(entry["split"]), entry_target(entry), entry_selection(entry)


def with_result(entries: list[dict[str, Any]], name: str, config: str, split: str, metrics: dict[str, Any],
                source: str) -> list[dict[str, Any]]:
    """The entries with one added, replacing any of the same name, config, split and target."""
    entry = {"name": name, "config": config, "split": split, "target": metrics.get("target") or "test_accuracy",
             "metrics": defined(metrics), "source": source,
             "scored_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    key = (name, table_key(entry))
    return [e for e in entries if (e["name"], table_key(e)) != key] + [entry]


def results_bytes(entries: list[dict[str, Any]]) -> bytes:
    """A results file's bytes: strict JSON (no NaN or infinity tokens)."""
    document = {"format": "stz-leaderboard", "version": 1, "entries": entries}
    return (json.dumps(document, indent=2, allow_nan=False) + "\n").encode()


def load_leaderboard(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The entries of a local results file (none where there is no file yet)."""
    path = Path(path)
    try:
        raw = read_small_file(path, "a leaderboard's results file", MAX_RESULTS_BYTES)
    except DataError as exc:
        raise SubmissionError(str(exc)) from None
    return [] if raw is None else parse_leaderboard(raw, str(path))


MAX_RESULTS_BYTES = 256 << 20
NUMBERS = ("tau", "r2", "l1", "accuracy", "macro_f1")


def parse_leaderboard(raw: bytes, where: str) -> list[dict[str, Any]]:
    """The entries of a results file, each checked for what rendering and ranking read; anything else (not strict
    JSON, NaN tokens, an entry of the wrong shape) is a SubmissionError naming `where` and the entry."""
    def refuse_constant(token: str) -> None:
        raise ValueError(f"{token} is not strict JSON")

    try:
        data = json.loads(raw, parse_constant=refuse_constant)
        entries = list(data["entries"])
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise SubmissionError(f"{where}: not a leaderboard results file ({exc})") from None
    for index, entry in enumerate(entries):
        problem = _entry_problem(entry)
        if problem:
            raise SubmissionError(f"{where}: entry {index}: {problem}; not a leaderboard results file")
    return entries


def _entry_problem(entry: Any) -> str | None:
    """What is wrong with one results entry, or None."""
    if not isinstance(entry, dict):
        return f"a JSON {type(entry).__name__}, not an object"
    for key in ("name", "config", "split"):
        if not isinstance(entry.get(key), str):
            return f"{key!r} is {entry.get(key)!r}, not text"
    metrics = entry.get("metrics")
    if not isinstance(metrics, dict):
        return f"'metrics' is {type(metrics).__name__}, not an object"
    for key, value in metrics.items():
        if (key in NUMBERS or key.startswith("tau@")) and value is not None and \
                (not isinstance(value, (int, float)) or isinstance(value, bool)):
            return f"metric {key!r} is {value!r}, not a number"
    for key, kind in (("intervals", dict), ("column_runs", dict), ("main_resamples", list), ("bootstrap", dict)):
        if key in metrics and metrics[key] is not None and not isinstance(metrics[key], kind):
            return f"{key!r} is a {type(metrics[key]).__name__}, not a {kind.__name__}"
    for column, bounds in (metrics.get("intervals") or {}).items():
        if not isinstance(bounds, list) or len(bounds) != 2 or \
                not all(b is None or (isinstance(b, (int, float)) and not isinstance(b, bool)) for b in bounds):
            return f"the interval of {column!r} is {bounds!r}, not [low, high]"
    if not all(v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
               for v in metrics.get("main_resamples") or []):
        return "'main_resamples' holds something other than numbers"
    for column, runs in (metrics.get("column_runs") or {}).items():
        if not isinstance(runs, int) or isinstance(runs, bool):
            return f"the runs of {column!r} are {runs!r}, not a whole number"
    if "runs" in metrics and not (isinstance(metrics["runs"], int) and not isinstance(metrics["runs"], bool)):
        return f"'runs' is {metrics['runs']!r}, not a whole number"
    return None


def column_runs(metrics: dict[str, Any], column: str) -> int | None:
    """The test runs a scored column rests on (None for scores written before they were recorded)."""
    runs = (metrics.get("column_runs") or {}).get(column)
    return runs if isinstance(runs, int) else None


def _cell(metrics: dict[str, Any], column: str) -> str:
    runs = column_runs(metrics, column)
    if runs is not None and too_few_runs(runs):
        return f"too few runs ({runs})"
    value = metrics.get(column)
    if not isinstance(value, (int, float)) or not math.isfinite(value):
        return "-"
    low, high = (metrics.get("intervals") or {}).get(column, (None, None))
    if isinstance(low, (int, float)) and isinstance(high, (int, float)):
        return f"{value:.3f} [{low:.3f}, {high:.3f}]"
    return f"{value:.3f}"


def _tied_with(best: dict[str, Any], other: dict[str, Any], column: str) -> bool | None:
    """Whether the paired interval of best - other holds 0 (None: the entries cannot be compared, scored on other
    resamples or before resamples were kept)."""
    a, b = best.get("main_resamples"), other.get("main_resamples")
    if not a or not b or len(a) != len(b) or best.get("bootstrap") != other.get("bootstrap") \
            or best.get("runs") != other.get("runs"):
        return None
    pairs = [(x, y) for x, y in zip(a, b) if x is not None and y is not None]
    if not pairs:
        return None
    return paired_difference(np.asarray([x for x, _ in pairs]), np.asarray([y for _, y in pairs]),
                             float(best[column]), float(other[column]))["tied"]


def render_leaderboard(entries: list[dict[str, Any]], thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS) -> str:
    """Ranked Markdown tables, one per zoo config, split, target and selection, best first. Each cell shows its 95% interval
    over test runs; entries whose paired interval of the difference with the best holds 0 share its rank ("1=").
    "-" where a metric is not defined (null: fewer than two checkpoints above a threshold)."""
    out = []
    for key in sorted({table_key(e) for e in entries}):
        target = get_target(key[2]) if key[2] in TARGETS else None
        classify = target is not None and target.kind == "classification"
        main = "accuracy" if classify else "tau"
        columns = ["accuracy", "macro_f1"] if classify else ["tau"] + [f"tau@{t:g}" for t in thresholds] + ["r2", "l1"]
        rows = sorted((e for e in entries if table_key(e) == key),
                      key=lambda e: (not _rankable(e["metrics"], main), -_finite(e["metrics"].get(main))))
        header = ["rank", "name"] + [c.replace("@", " >= ") for c in columns] + ["runs"]
        title = " / ".join(markdown_text(part) for part in key if part != EVERY_CHECKPOINT)
        out += [f"### {title}", "",
                "Each cell: the score [95% interval from a bootstrap over the split's runs]; `1=`: tied with the "
                "best (the paired interval of the difference holds 0); \"too few runs (n)\": a figure resting on "
                f"fewer than {MIN_RUNS} runs, shown as no figure and, for the main one, not ranked (`-`).", "",
                "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for rank, e in enumerate(rows, start=1):
            m = e["metrics"]
            shown = str(rank) if _rankable(m, main) else "-"
            if rank > 1 and _rankable(m, main) and _tied_with(rows[0]["metrics"], m, main):
                shown = "1="
            out.append(f"| {shown} | {markdown_text(str(e['name']))} | "
                       + " | ".join(_cell(m, c) for c in columns) + f" | {m.get('runs', '-')} |")
        out.append("")
    return "\n".join(out)


def _rankable(metrics: dict[str, Any], main: str) -> bool:
    """An entry ranks where its main figure is defined and rests on enough runs (`too_few_runs`)."""
    runs = column_runs(metrics, main)
    return math.isfinite(_finite(metrics.get(main))) and (runs is None or not too_few_runs(runs))


def _finite(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else -math.inf


def markdown_text(text: str) -> str:
    """Text shown as itself in a Markdown table cell: no markup, links, HTML or cell breaks."""
    flat = " ".join(text.split())
    return re.sub(r"([\\`*_{}\[\]()<>#+!|~])", r"\\\1", flat)
