"""Which checkpoints a read returns: one rule, one implementation, for every read path.

The fast path (`Zoo.select`, `Zoo.weight_space`), the `datasets` builder (`load_dataset`, prepared and streaming)
and the benchmark's data loader all call `select_rows` with a `Selection`, so the same filter gives the same rows,
in the same order, whichever way a zoo is read. A selection runs on the metadata before any weight is read.

- `where`, per metadata column: a value (equality), a `(low, high)` tuple (inclusive, None for an open end), a list
  or set (membership), or None (the rows where the column is null). Nulls never match anything else. Values must
  have the column's type: a whole number for an integer column (`epoch`, `seed`, `row`; a float is refused, never
  rounded), True/False for a boolean column, text for a text column, a number for a float column. A value of
  `optimizer` or `split` outside the set those columns hold is an error (it would select nothing).
- `min_accuracy`/`max_accuracy` (test accuracy, inclusive), `epochs` and `best_only` are shorthands for conditions
  on `test_accuracy`, `epoch` and `is_best`.
- Diverged checkpoints (`diverged`, whose metrics mean nothing) are left out unless `include_diverged=True`.
- `distinct=True` (the default) counts each distinct checkpoint once: a row whose weights (`params_digest`) equal
  those of a row selected before it is left out. A run's best checkpoint is a copy of one of its epochs; when that
  epoch is selected too, the best row is the one left out.
- A condition on a column that the zoo withholds (a leaderboard's public copy) is a `LabelsWithheldError`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..errors import LabelsWithheldError
from .metadata import COLUMNS, METADATA_SCHEMA, OPTIMIZERS
from .splits import SPLIT_NAMES

# Text columns whose every value is one of a known set: any other value would select nothing, so it is an error.
KNOWN_VALUES = {"optimizer": OPTIMIZERS, "split": SPLIT_NAMES}

Condition = tuple[str, str, Any]  # (column, "eq" | "range" | "in" | "null", value)


def _kind(column: str) -> str:
    kind = METADATA_SCHEMA.field(column).type
    if pa.types.is_integer(kind):
        return "integer"
    if pa.types.is_boolean(kind):
        return "boolean"
    if pa.types.is_floating(kind):
        return "number"
    return "text"


def _check_value(column: str, value: Any) -> Any:
    """`value` as a condition on `column` may hold it, or a ValueError naming the column and the type it takes."""
    kind = _kind(column)
    ok = {"integer": isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)),
          "boolean": isinstance(value, (bool, np.bool_)),
          "number": isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
                    and math.isfinite(float(value)),
          "text": isinstance(value, str)}[kind]
    if not ok:
        article = "an" if kind == "integer" else "a"
        raise ValueError(f"where[{column!r}]: {value!r} ({type(value).__name__}) is not {article} {kind}; column "
                         f"{column!r} holds {kind}s ({METADATA_SCHEMA.field(column).type})")
    known = KNOWN_VALUES.get(column)
    if known is not None and value not in known:
        raise ValueError(f"where[{column!r}]: unknown value {value!r}; column {column!r} holds one of {list(known)}")
    return value.item() if isinstance(value, np.generic) else value


def normalise_where(where: Mapping[str, Any] | None) -> list[Condition]:
    """Each column's condition as (column, op, value), checked against the metadata columns and their types."""
    out: list[Condition] = []
    if where is not None and not isinstance(where, Mapping):
        raise ValueError(f"where must map columns to conditions, e.g. {{'epoch': 1}} or {{'epoch': (1, 6)}}; got a "
                         f"{type(where).__name__} ({where!r:.60})")
    for column, value in (where or {}).items():
        if column not in COLUMNS:
            raise ValueError(f"where: unknown column {column!r}; metadata columns are {list(COLUMNS)}")
        if value is None:
            out.append((column, "null", None))
        elif isinstance(value, tuple):
            if len(value) != 2:
                raise ValueError(f"where[{column!r}]: a range is a (low, high) pair, got {value!r}")
            low, high = (None if v is None else _check_value(column, v) for v in value)
            if low is not None and high is not None and low > high:
                raise ValueError(f"where[{column!r}]: the range ({low!r}, {high!r}) is reversed (its low end is above "
                                 f"its high end) and would select nothing; write ({high!r}, {low!r})")
            out.append((column, "range", [low, high]))
        elif isinstance(value, (list, set, frozenset)):
            out.append((column, "in", sorted((_check_value(column, v) for v in value), key=repr)))
        elif isinstance(value, (str, int, float, bool, np.generic)):
            out.append((column, "eq", _check_value(column, value)))
        else:
            raise ValueError(f"where[{column!r}]: {value!r} is neither a value, a (low, high) range nor a list")
    return out


def where_of(conditions: Iterable[Any]) -> dict[str, Any]:
    """The `where` that `normalise_where` turns into these (column, op, value) conditions: a selection stored as
    JSON (a leaderboard claim) read back, checked as any `where` is."""
    out: dict[str, Any] = {}
    for condition in conditions:
        if not isinstance(condition, (list, tuple)) or len(condition) != 3 or not isinstance(condition[0], str):
            raise ValueError(f"where: {condition!r} is not a [column, op, value] condition")
        column, op, value = condition
        if column in out:
            raise ValueError(f"where: column {column!r} is given twice")
        if op == "eq" and isinstance(value, (str, int, float, bool)):
            out[column] = value
        elif op == "in" and isinstance(value, list):
            out[column] = list(value)
        elif op == "range" and isinstance(value, (list, tuple)) and len(value) == 2:
            out[column] = tuple(value)
        elif op == "null" and value is None:
            out[column] = None
        else:
            raise ValueError(f"where: {condition!r} is not a [column, op, value] condition (op one of eq, in, "
                             f"range, null, with a value of its shape)")
    normalise_where(out)
    return out


@dataclass(frozen=True)
class Selection:
    """A read's filters (module docstring); the defaults select every distinct, non-diverged checkpoint."""

    where: tuple[Condition, ...] = ()
    min_accuracy: float | None = None
    max_accuracy: float | None = None
    epochs: tuple[int, ...] | None = None
    best_only: bool = False
    include_diverged: bool = False
    distinct: bool = True

    @classmethod
    def of(cls, where: Mapping[str, Any] | None = None, *, min_accuracy: float | None = None,
           max_accuracy: float | None = None, epochs: Iterable[int] | None = None, best_only: bool = False,
           include_diverged: bool = False, distinct: bool = True) -> "Selection":
        """A checked selection from the keyword arguments every read function takes."""
        for name, bound in (("min_accuracy", min_accuracy), ("max_accuracy", max_accuracy)):
            if bound is not None:
                _check_value("test_accuracy", bound)
        if min_accuracy is not None and max_accuracy is not None and min_accuracy > max_accuracy:
            raise ValueError(f"min_accuracy {min_accuracy!r} is above max_accuracy {max_accuracy!r}: the range is "
                             f"reversed and would select nothing")
        chosen = None if epochs is None else tuple(_check_value("epoch", e) for e in epochs)
        for name, flag in (("best_only", best_only), ("include_diverged", include_diverged), ("distinct", distinct)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name} must be True or False, got {flag!r}")
        return cls(tuple(tuple(c) for c in normalise_where(where)), min_accuracy, max_accuracy, chosen, best_only,
                   include_diverged, distinct)

    def conditions(self) -> list[Condition]:
        """Every condition on a column, the shorthands included."""
        out = list(self.where)
        if self.min_accuracy is not None or self.max_accuracy is not None:
            out.append(("test_accuracy", "range", [self.min_accuracy, self.max_accuracy]))
        if self.epochs is not None:
            out.append(("epoch", "in", list(self.epochs)))
        if self.best_only:
            out.append(("is_best", "eq", True))
        return out

    def to_json(self) -> str:
        """A stable text form (the `datasets` builder's config and cache key)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "Selection":
        data = json.loads(text)
        return cls(tuple(tuple(c) for c in data["where"]), data["min_accuracy"], data["max_accuracy"],
                   None if data["epochs"] is None else tuple(data["epochs"]), data["best_only"],
                   data["include_diverged"], data["distinct"])


def _condition_mask(data: pa.ChunkedArray, op: str, value: Any) -> pa.ChunkedArray | pa.Array:
    if op == "null":
        return pc.is_null(data)
    if op == "eq":
        return pc.equal(data, pa.scalar(value, data.type))
    if op == "in":
        return pc.is_in(data, pa.array(value, data.type))
    low, high = value
    hit: Any = pa.array(np.ones(len(data), dtype=bool))
    if low is not None:
        hit = pc.and_(hit, pc.greater_equal(data, pa.scalar(low, data.type)))
    if high is not None:
        hit = pc.and_(hit, pc.less_equal(data, pa.scalar(high, data.type)))
    return hit


def select_rows(table: pa.Table, selection: Selection, withheld: Iterable[str] = (), where: object = None) -> np.ndarray:
    """Indices (ascending, so in metadata order) of the rows of a split's metadata `table` that `selection` picks;
    `withheld` are the columns this copy of the zoo holds back, `where` names the zoo in errors."""
    conditions = selection.conditions()
    hidden = sorted({column for column, _, _ in conditions} & set(withheld))
    if hidden:
        raise LabelsWithheldError(where, f"columns {hidden} are withheld in this public copy of the zoo; it cannot "
                                         f"select by them")
    mask = np.ones(table.num_rows, dtype=bool)
    for column, op, value in conditions:
        hit = _condition_mask(table.column(column), op, value)
        mask &= pc.fill_null(hit, False).to_numpy(zero_copy_only=False)
    if not selection.include_diverged:
        mask &= ~table.column("diverged").to_numpy(zero_copy_only=False)
    indices = np.nonzero(mask)[0]
    if selection.distinct and len(indices):
        digests = table.column("params_digest").take(pa.array(indices)).to_pylist()
        seen: set[str] = set()
        keep = []
        for position, digest in enumerate(digests):
            if digest is None or digest not in seen:
                keep.append(position)
                if digest is not None:
                    seen.add(digest)
        indices = indices[keep]
    return indices


def parse_where(items: Iterable[str]) -> dict[str, Any]:
    """`where` from `COLUMN=VALUE` texts, as the command line writes them: `optimizer=adam`, `epoch=1,6,12`
    (membership), `learning_rate=1e-4..1e-3` (inclusive range; `0.5..` and `..0.5` leave an end open),
    `train_loss=null`; each value read as its column's type."""
    out: dict[str, Any] = {}
    for item in items:
        column, sep, text = item.partition("=")
        column = column.strip()
        if not sep or not column:
            raise ValueError(f"where: {item!r} is not COLUMN=VALUE")
        if column not in COLUMNS:
            raise ValueError(f"where: unknown column {column!r}; metadata columns are {list(COLUMNS)}")
        if column in out:
            raise ValueError(f"where: column {column!r} is given twice")
        text = text.strip()
        if text == "null":
            out[column] = None
        elif ".." in text:
            low, _, high = text.partition("..")
            out[column] = tuple(None if not part.strip() else _parse_value(column, part) for part in (low, high))
        elif "," in text:
            out[column] = [_parse_value(column, part) for part in text.split(",")]
        else:
            out[column] = _parse_value(column, text)
    normalise_where(out)
    return out


def _parse_value(column: str, text: str) -> Any:
    text, kind = text.strip(), _kind(column)
    try:
        if kind == "integer":
            return int(text)
        if kind == "number":
            value = float(text)
            if not math.isfinite(value):
                raise ValueError
            return value
    except ValueError:
        raise ValueError(f"where[{column!r}]: {text!r} is not {'an' if kind == 'integer' else 'a'} {kind}; column "
                         f"{column!r} holds {kind}s ({METADATA_SCHEMA.field(column).type})") from None
    if kind == "boolean":
        if text.lower() not in ("true", "false"):
            raise ValueError(f"where[{column!r}]: {text!r} is not true or false")
        return text.lower() == "true"
    return text
