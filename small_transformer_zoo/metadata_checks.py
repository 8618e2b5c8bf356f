"""Every read of a split's metadata is checked: the file's bytes against the manifest, then its values.

The manifest's size and sha256 catch any edit of the file; the value checks catch a zoo whose manifest was
rewritten to match a bad file, or one written by other tools: unique checkpoint ids, the right split in every row
and for every run (by the zoo's own split rule), accuracies in [0, 1] and finite losses for every checkpoint not
marked diverged, and the row count the manifest gives.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .errors import ZooFormatError
from .metadata import METRICS, conform_metadata
from .splits import assign_split

ACCURACIES = ("train_accuracy", "validation_accuracy", "test_accuracy")
LOSSES = ("train_loss", "validation_loss", "test_loss")


def load_checked_metadata(raw: bytes, info: dict[str, Any], split: str, split_rule: dict[str, Any],
                          where: str) -> pa.Table:
    """The split's metadata table from the file's bytes, after every check; `where` names the file in errors."""
    if len(raw) != info["bytes"]:
        raise ZooFormatError(where, f"size is {len(raw)} bytes, the manifest says {info['bytes']}")
    digest = hashlib.sha256(raw).hexdigest()
    if digest != info["sha256"]:
        raise ZooFormatError(where, f"sha256 is {digest}, the manifest says {info['sha256']}: the metadata was "
                                    f"altered or damaged")
    try:
        table = pq.read_table(pa.BufferReader(raw))
    except (pa.ArrowException, OSError) as exc:
        raise ZooFormatError(where, f"not a readable Parquet file ({exc})") from None
    table = conform_metadata(table, where)
    if table.num_rows != info["rows"]:
        raise ZooFormatError(where, f"has {table.num_rows} rows, the manifest says {info['rows']}")
    check_metadata_values(table, split, split_rule, where, withheld_columns(info, where))
    return table


def withheld_columns(info: dict[str, Any], where: str) -> tuple[str, ...]:
    """The metric columns a public copy of a leaderboard zoo holds back in this split (docs/design.md section 10)."""
    withheld = info.get("withheld", [])
    if not isinstance(withheld, list) or not set(withheld) <= set(METRICS) or len(set(withheld)) != len(withheld):
        raise ZooFormatError(where, f"the manifest's 'withheld' is {withheld!r}, not a list of metric columns "
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
        raise ZooFormatError(where, f"checkpoint_id {twice!r} occurs more than once")
    wrong = pc.not_equal(table.column("split"), split)
    if pc.any(wrong).as_py():
        i = int(np.argmax(wrong.to_numpy(zero_copy_only=False)))
        raise ZooFormatError(where, f"checkpoint {ids[i].as_py()!r} says split {table.column('split')[i].as_py()!r} "
                                    f"in the {split!r} metadata")
    fractions, salt = split_rule.get("fractions"), split_rule.get("salt")
    if fractions is not None and salt is not None:
        for run in pc.unique(table.column("run_id")).to_pylist():
            if assign_split(run, fractions, salt) != split:
                raise ZooFormatError(where, f"run {run!r} belongs to split {assign_split(run, fractions, salt)!r} by "
                                            f"the zoo's split rule, not {split!r}")
    for column in withheld:
        if table.column(column).null_count != table.num_rows:
            raise ZooFormatError(where, f"column {column!r} is withheld in split {split!r} but holds values")
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
            raise ZooFormatError(where, f"checkpoint {ids[i].as_py()!r}: {column} is {shown}, not {rule} (the "
                                        f"checkpoint is not marked diverged)")
