"""The metadata table: one row per checkpoint, the same columns in every zoo and split.

Columns that a zoo cannot know (an imported original release has no validation accuracy) are null, never absent,
so every split of every zoo has one schema and plain `datasets.load_dataset("parquet", ...)` reads them all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from ..errors import ZooDamagedError

HYPERPARAMETERS = ("optimizer", "learning_rate", "dropout", "w_init_std", "l2", "train_fraction")
OPTIMIZERS = ("sgd", "sgd_momentum", "adam", "rmsprop")  # the values of `optimizer` (torch.optim's update rules)
METRICS = ("train_accuracy", "validation_accuracy", "test_accuracy", "train_loss", "validation_loss", "test_loss")

# What every column means and its unit; stored in each Parquet file's schema and shown in the dataset card.
DESCRIPTIONS = {
    "checkpoint_id": "unique id of the checkpoint: `<run_id>-e<epoch>` or `<run_id>-best`",
    "run_id": "the training run the checkpoint comes from (all of a run's checkpoints share a split)",
    "epoch": "training epoch after which the checkpoint was saved (1-based; -1 for an imported best checkpoint "
             "whose epoch the source does not give)",
    "is_best": "true for the run's best epoch by validation accuracy (a copy of one epoch's weights)",
    "split": "train, validation or test (by a salted hash of run_id)",
    "optimizer": "sgd, sgd_momentum, adam or rmsprop",
    "learning_rate": "peak learning rate (after warm-up)",
    "dropout": "dropout probability (fraction) after the embedding and in each block",
    "w_init_std": "standard deviation of the normal initialisation of weight matrices",
    "l2": "L2 regularisation, applied as the optimizer's weight decay",
    "train_fraction": "fraction of the training set the run trained on",
    "seed": "the run's random seed (of its initialisation; in a built zoo, run_config names the seeds of its data "
            "order and dropout)",
    "run_config": "JSON object of any other training setting the source recorded (a built zoo: data_seed and "
                  "dropout_seed; null when none)",
    "train_accuracy": "accuracy on the run's training data (fraction in [0, 1], correct / total)",
    "validation_accuracy": "accuracy on the validation hold-out (fraction, correct / total; null if unmeasured)",
    "test_accuracy": "accuracy on the task's test set (fraction, correct / total): the benchmark's label",
    "train_loss": "mean cross-entropy on the training data (nats)",
    "validation_loss": "mean cross-entropy on the validation hold-out (nats)",
    "test_loss": "mean cross-entropy on the test set (nats)",
    "diverged": "true when the run's loss became NaN or infinite; its metrics then mean nothing",
    "shard": "the weights file holding the checkpoint, relative to the config folder",
    "row": "the checkpoint's row in that shard's params matrix (0-based)",
    "params_digest": "BLAKE2b-128 hex digest of the checkpoint's float32 parameter row, checked on every load",
    "duplicate_of": "checkpoint_id of an earlier row of this split with the same weights (a run's best checkpoint "
                    "is a copy of one of its epochs: when that epoch is stored too, this names it); null when the "
                    "weights occur here first. Reads count each distinct checkpoint once unless distinct=False",
}


def _field(name: str, kind: pa.DataType, nullable: bool = True) -> pa.Field:
    return pa.field(name, kind, nullable=nullable, metadata={"description": DESCRIPTIONS[name]})


METADATA_SCHEMA = pa.schema(
    [
        _field("checkpoint_id", pa.string(), nullable=False),
        _field("run_id", pa.string(), nullable=False),
        _field("epoch", pa.int32(), nullable=False),
        _field("is_best", pa.bool_(), nullable=False),
        _field("split", pa.string(), nullable=False),
        _field("optimizer", pa.string()),
        _field("learning_rate", pa.float64()),
        _field("dropout", pa.float64()),
        _field("w_init_std", pa.float64()),
        _field("l2", pa.float64()),
        _field("train_fraction", pa.float64()),
        _field("seed", pa.int64()),
        _field("run_config", pa.string()),
        *[_field(name, pa.float64()) for name in METRICS],
        _field("diverged", pa.bool_(), nullable=False),
        _field("shard", pa.string(), nullable=False),
        _field("row", pa.int64(), nullable=False),
        _field("params_digest", pa.string()),
        _field("duplicate_of", pa.string()),
    ]
)
COLUMNS = tuple(METADATA_SCHEMA.names)
# Columns added after the first zoos were written: absent in an older file, they read as nulls.
LATER_COLUMNS = ("run_config", "params_digest", "duplicate_of")
# What a caller of ZooWriter.add must give; the writer fills checkpoint_id, split, shard and row itself.
REQUIRED_INPUT = ("run_id", "epoch", "test_accuracy")
WRITER_OWNED = ("split", "shard", "row", "params_digest", "duplicate_of")


def checkpoint_id_for(run_id: str, epoch: int, is_best: bool) -> str:
    """Stable id of a checkpoint: `<run_id>-best` for the best epoch, `<run_id>-e<epoch>` otherwise."""
    return f"{run_id}-best" if is_best else f"{run_id}-e{int(epoch):03d}"


def normalise_row(row: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Check one caller-supplied metadata row and fill defaults; `where` names it in errors."""
    unknown = sorted(set(row) - set(COLUMNS))
    if unknown:
        raise ValueError(f"{where}: unknown metadata fields {unknown}; known fields are {list(COLUMNS)}")
    owned = sorted(set(row) & set(WRITER_OWNED))
    if owned:
        raise ValueError(f"{where}: fields {owned} are set by the writer, not the caller")
    missing = [name for name in REQUIRED_INPUT if row.get(name) is None]
    if missing:
        raise ValueError(f"{where}: missing required metadata fields {missing}")
    out = {name: row.get(name) for name in COLUMNS}
    out["run_id"] = str(row["run_id"])
    out["epoch"] = int(row["epoch"])
    out["is_best"] = bool(row.get("is_best", False))
    out["diverged"] = bool(row.get("diverged", False))
    out["checkpoint_id"] = str(row.get("checkpoint_id") or checkpoint_id_for(out["run_id"], out["epoch"], out["is_best"]))
    accuracy = float(row["test_accuracy"])
    if not out["diverged"] and not (math.isfinite(accuracy) and 0.0 <= accuracy <= 1.0):
        raise ValueError(f"{where}: test_accuracy must be a fraction in [0, 1], got {row['test_accuracy']!r}")
    return out


def build_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Rows (already normalised and placed) to an Arrow table in the canonical schema."""
    return pa.Table.from_pylist(rows, schema=METADATA_SCHEMA)


def conform_metadata(table: pa.Table, where: str) -> pa.Table:
    """The table in the canonical schema: every column there (later ones as nulls when absent), in order, each of
    its column's type and without nulls where the schema allows none; `where` names the file in errors."""
    missing = [name for name in COLUMNS if name not in table.column_names and name not in LATER_COLUMNS]
    if missing:
        raise ZooDamagedError(where, f"metadata lacks columns {missing}")
    columns = []
    for field in METADATA_SCHEMA:
        if field.name not in table.column_names:
            columns.append(pa.nulls(table.num_rows, field.type))
            continue
        data = table.column(field.name)
        if data.type != field.type:
            try:
                data = data.cast(field.type, safe=True)
            except (pa.ArrowException, ValueError) as exc:
                raise ZooDamagedError(where, f"column {field.name!r} is {data.type}, not {field.type}, and does not "
                                            f"convert exactly ({' '.join(str(exc).split())[:120]})") from None
        if not field.nullable and data.null_count:
            first = table.column("checkpoint_id")[pc.index(pc.is_null(data), True).as_py()].as_py() \
                if field.name != "checkpoint_id" and "checkpoint_id" in table.column_names else None
            raise ZooDamagedError(where, f"column {field.name!r} has {data.null_count} nulls (first at checkpoint "
                                        f"{first!r}); the format allows none")
        columns.append(data)
    return pa.Table.from_arrays(columns, schema=METADATA_SCHEMA)
