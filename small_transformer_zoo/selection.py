"""Selecting checkpoints by their metadata: `where={"optimizer": "adam", "learning_rate": (1e-4, 1e-3)}`.

A value selects by equality, a `(low, high)` tuple an inclusive range (None for an open end), a list or set
membership, and None the rows where the column is null. Nulls never match anything else. The same filter serves
`Zoo.select` (the fast path) and `load_dataset(..., where=...)`, where it runs on the metadata before any weight
is read, so only the matching rows' bytes are fetched.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .metadata import COLUMNS

Condition = tuple[str, Any]


def normalise_where(where: Mapping[str, Any] | None) -> dict[str, Condition]:
    """Each column's condition as ("eq" | "range" | "in" | "null", value), checked against the metadata columns."""
    out: dict[str, Condition] = {}
    for column, value in (where or {}).items():
        if column not in COLUMNS:
            raise ValueError(f"where: unknown column {column!r}; metadata columns are {list(COLUMNS)}")
        if value is None:
            out[column] = ("null", None)
        elif isinstance(value, tuple):
            if len(value) != 2:
                raise ValueError(f"where[{column!r}]: a range is a (low, high) pair, got {value!r}")
            out[column] = ("range", list(value))
        elif isinstance(value, (list, set, frozenset)):
            out[column] = ("in", sorted(value, key=repr))
        elif isinstance(value, (str, int, float, bool)):
            out[column] = ("eq", value)
        else:
            raise ValueError(f"where[{column!r}]: {value!r} is neither a value, a (low, high) range nor a list")
    return out


def where_to_json(where: Mapping[str, Any] | None) -> str | None:
    """A stable text form of a filter (for the `datasets` builder config and its cache key)."""
    conditions = normalise_where(where)
    return json.dumps(conditions, sort_keys=True) if conditions else None


def where_mask(table: pa.Table, conditions: Mapping[str, Condition]) -> np.ndarray:
    """Boolean mask of the rows of `table` that meet every condition."""
    mask = np.ones(table.num_rows, dtype=bool)
    for column, (op, value) in conditions.items():
        data = table.column(column)
        if op == "null":
            hit = pc.is_null(data)
        elif op == "eq":
            hit = pc.equal(data, pa.scalar(value, data.type))
        elif op == "in":
            hit = pc.is_in(data, pa.array(value, data.type))
        else:
            low, high = value
            hit = pa.chunked_array([pa.array(np.ones(table.num_rows, dtype=bool))])
            if low is not None:
                hit = pc.and_(hit, pc.greater_equal(data, pa.scalar(low, data.type)))
            if high is not None:
                hit = pc.and_(hit, pc.less_equal(data, pa.scalar(high, data.type)))
        mask &= pc.fill_null(hit, False).to_numpy(zero_copy_only=False)
    return mask
