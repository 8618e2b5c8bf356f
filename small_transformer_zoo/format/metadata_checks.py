"""Every read of a split's metadata is checked, on every read path, by this one list of checks: the file's
bytes against the manifest, then its values and where its rows point.

The manifest's size and sha256 catch any edit of the file; the value checks catch a zoo whose manifest was
rewritten to match a bad file, or one written by other tools: the schema's types and non-null columns, unique
checkpoint ids, the right split in every row and for every run (by the zoo's own split rule), accuracies in [0, 1]
and finite losses for every checkpoint not marked diverged, a row digest for every checkpoint, one best checkpoint
per run (`format.invariants`), and the row count the manifest gives. The references: every row names one of the split's shards and a row inside it, no (shard,
row) is named twice, and rows come in storage order (the manifest's shard order, then row), so every read path
yields a selection in the same order.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from ..errors import ZooDamagedError, ZooFormatError
from .checksums import check_bytes
from .invariants import one_best_per_run
from .metadata import METRICS, conform_metadata
from .splits import FAMILY_KEYS, SplitRule

ACCURACIES = ("train_accuracy", "validation_accuracy", "test_accuracy")
LOSSES = ("train_loss", "validation_loss", "test_loss")


def load_checked_metadata(raw: bytes, manifest: dict[str, Any], split: str, where: str) -> pa.Table:
    """The split's metadata table from the file's bytes, after every check; `where` names the file in errors."""
    info = manifest["metadata"][split]
    check_bytes(raw, info["bytes"], info["sha256"], where)
    try:
        table = pq.ParquetFile(pa.BufferReader(raw)).read(use_threads=False)
    except (pa.ArrowException, OSError) as exc:
        raise ZooDamagedError(where, f"not a readable Parquet file ({exc})") from None
    table = conform_metadata(table, where)
    if table.num_rows != info["rows"]:
        raise ZooDamagedError(where, f"has {table.num_rows} rows, the manifest says {info['rows']}")
    check_metadata_values(table, split, manifest["splits"], where, withheld_columns(info, where))
    check_references(table, [(s["path"], s["rows"]) for s in manifest["shards"] if s["split"] == split], where)
    return table


def check_duplicates(table: pa.Table, where: str) -> None:
    """`duplicate_of`, where given, names an earlier row of the split with the same weights."""
    marks = table.column("duplicate_of").to_pylist()
    if not any(m is not None for m in marks):
        return
    ids, digests = table.column("checkpoint_id").to_pylist(), table.column("params_digest").to_pylist()
    earlier: dict[str, str] = {}
    for checkpoint, digest, mark in zip(ids, digests, marks):
        if mark is not None and earlier.get(mark) != digest:
            raise ZooDamagedError(where, f"checkpoint {checkpoint!r}: duplicate_of is {mark!r}, which is not an "
                                        f"earlier checkpoint of this split with the same weights")
        earlier[checkpoint] = digest


def check_references(table: pa.Table, shards: list[tuple[str, int]], where: str) -> None:
    """Every row points into one of the split's `shards` ((path, rows) in manifest order), each (shard, row) once,
    in storage order."""
    order = {name: (index, rows) for index, (name, rows) in enumerate(shards)}
    names = table.column("shard").to_pylist()
    unknown = sorted(set(names) - set(order))
    if unknown:
        raise ZooDamagedError(where, f"column 'shard' names shards {unknown[:3]} that the manifest does not list for "
                                    f"this split")
    rows = table.column("row").to_numpy()
    position = np.array([order[n][0] for n in names], dtype=np.int64)
    limit = np.array([order[n][1] for n in names], dtype=np.int64)
    ids = table.column("checkpoint_id")
    bad = np.nonzero((rows < 0) | (rows >= limit))[0]
    if bad.size:
        i = int(bad[0])
        raise ZooDamagedError(where, f"{bad.size} rows point past their shard's end, first: checkpoint "
                                    f"{ids[i].as_py()!r} -> {names[i]} row {rows[i]} (shard has {limit[i]} rows)")
    key = position * (int(limit.max(initial=0)) + 1) + rows
    if len(key) > 1:
        steps = np.diff(key)
        if (steps == 0).any():
            i = int(np.argmax(steps == 0)) + 1
            raise ZooDamagedError(where, f"checkpoints {ids[i - 1].as_py()!r} and {ids[i].as_py()!r} both point to "
                                        f"{names[i]} row {rows[i]}: each row holds one checkpoint")
        if (steps < 0).any():
            i = int(np.argmax(steps < 0)) + 1
            seen = dict.fromkeys(zip(position.tolist(), rows.tolist()))
            if len(seen) != len(key):
                twice = next(k for k, c in Counter(zip(position.tolist(), rows.tolist())).items() if c > 1)
                raise ZooDamagedError(where, f"two checkpoints point to {shards[twice[0]][0]} row {twice[1]}: each "
                                            f"row holds one checkpoint")
            raise ZooDamagedError(where, f"checkpoint {ids[i].as_py()!r} ({names[i]} row {rows[i]}) comes after "
                                        f"{ids[i - 1].as_py()!r} ({names[i - 1]} row {rows[i - 1]}): metadata rows "
                                        f"must be in storage order")


def withheld_columns(info: dict[str, Any], where: str) -> tuple[str, ...]:
    """The metric columns a public copy of a leaderboard zoo holds back in this split (docs/design.md section 10)."""
    withheld = info.get("withheld", [])
    if not isinstance(withheld, list) or not set(withheld) <= set(METRICS) or len(set(withheld)) != len(withheld):
        raise ZooDamagedError(where, f"the manifest's 'withheld' is {withheld!r}, not a list of metric columns "
                                    f"{list(METRICS)}")
    return tuple(withheld)


def check_metadata_values(table: pa.Table, split: str, split_rule: dict[str, Any], where: str,
                          withheld: tuple[str, ...] = ()) -> None:
    """Raise ZooFormatError naming the first offending checkpoint of any broken rule; withheld columns must be
    null in every row."""
    ids = table.column("checkpoint_id")
    if pc.count_distinct(ids).as_py() != table.num_rows:
        counts = pc.value_counts(ids)
        twice = next(c["values"] for c in counts.to_pylist() if c["counts"] > 1)
        raise ZooDamagedError(where, f"checkpoint_id {twice!r} occurs more than once")
    wrong = pc.not_equal(table.column("split"), split)
    if pc.any(wrong).as_py():
        i = int(np.argmax(wrong.to_numpy(zero_copy_only=False)))
        raise ZooDamagedError(where, f"checkpoint {ids[i].as_py()!r} says split {table.column('split')[i].as_py()!r} "
                                    f"in the {split!r} metadata")
    if split_rule.get("fractions") is not None and split_rule.get("salt") is not None:
        check_split_units(table, split, SplitRule.from_manifest(split_rule), where)
    for column in withheld:
        if table.column(column).null_count != table.num_rows:
            raise ZooDamagedError(where, f"column {column!r} is withheld in split {split!r} but holds values")
    digests = table.column("params_digest")
    malformed = pc.invert(pc.fill_null(pc.match_substring_regex(digests, "^[0-9a-f]{32}$"), False))
    if pc.any(malformed).as_py():
        i = int(np.argmax(malformed.to_numpy(zero_copy_only=False)))
        raise ZooDamagedError(where, f"checkpoint {ids[i].as_py()!r}: params_digest is {digests[i].as_py()!r}, not "
                                    f"the 32 hex digits of its weights' BLAKE2b-128 (every checkpoint needs one)")
    check_duplicates(table, where)
    one_best_per_run(table.column("run_id").to_pylist(), table.column("is_best").to_pylist(), where)
    kept = ~table.column("diverged").to_numpy(zero_copy_only=False)
    for column in (c for c in ACCURACIES + LOSSES if c not in withheld):
        data = table.column(column)
        values = data.to_numpy(zero_copy_only=False).astype(np.float64)  # nulls become NaN
        present = ~pc.is_null(data).to_numpy(zero_copy_only=False) if column != "test_accuracy" else kept
        if column in ACCURACIES:
            bad = kept & present & ~((values >= 0.0) & (values <= 1.0))
            rule = "a fraction in [0, 1]"
        else:
            bad = kept & present & ~(np.isfinite(values) & (values >= 0.0))
            rule = "a finite non-negative number"
        if bad.any():
            i = int(np.argmax(bad))
            shown = "null" if data[i].as_py() is None else repr(float(values[i]))
            raise ZooDamagedError(where, f"checkpoint {ids[i].as_py()!r}: {column} is {shown}, not {rule} (the "
                                        f"checkpoint is not marked diverged)")


def check_split_units(table: pa.Table, split: str, rule: SplitRule, where: str) -> None:
    """Every run of the table is in the split that the zoo's rule assigns to its unit (run or family)."""
    columns = ["run_id"] + ([k for k in FAMILY_KEYS if k not in rule.varies] if rule.by == "family" else [])
    units = table.select(columns).group_by(columns).aggregate([]).to_pylist()
    for row in units:
        if (expected := rule.assign(row)) != split:
            unit = f"run {row['run_id']!r}" + (f" (family {rule.unit(row)!r})" if rule.by == "family" else "")
            raise ZooDamagedError(where, f"{unit} belongs to split {expected!r} by the zoo's split rule, not {split!r}")
