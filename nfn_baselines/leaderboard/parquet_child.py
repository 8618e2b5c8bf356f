"""Reading a submitted Parquet file in a child process: pyarrow can abort the whole process on some damaged files
(SIGABRT from a C++ check), so the scorer never parses untrusted Parquet in its own process. This module imports
pyarrow only, so the child starts fast."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

BATCH_ROWS = 4096


def decoded_bytes(column: pa.Array) -> int:
    """What a column takes once decoded: a dictionary-encoded column counts every value it stands for (a small file
    of repeated long strings decodes to gigabytes), without decoding it."""
    if pa.types.is_dictionary(column.type):
        values = column.dictionary
        if pa.types.is_string(values.type) or pa.types.is_binary(values.type):
            per_value = pc.binary_length(values).cast(pa.int64())
        else:  # fixed-width values (numbers)
            per_value = pa.array(np.full(len(values), values.type.byte_width, dtype=np.int64))
        taken = pc.take(per_value, column.indices)
        return int(pc.sum(taken).as_py() or 0) + 8 * len(column)
    return column.nbytes


def read_columns(raw: bytes, columns: tuple[str, ...], max_rows: int, max_bytes: int) -> tuple[str, Any]:
    """("ok", {column: values}), ("columns", names found) or ("error", why): the row limit is checked from the
    footer, the decoded size batch by batch (dictionaries counted as what they decode to) before a value is
    turned into Python, so a small file that decodes to gigabytes stops early."""
    try:
        handle = pq.ParquetFile(pa.BufferReader(raw), read_dictionary=list(columns))
        if handle.metadata.num_rows > max_rows:
            return "error", f"{handle.metadata.num_rows:,} rows, more than the {max_rows:,} a submission may have"
        names = list(handle.schema_arrow.names)
        if sorted(names) != sorted(columns) or len(names) != len(set(names)):
            return "columns", names
        out: dict[str, list[Any]] = {name: [] for name in columns}
        decoded = 0
        for batch in handle.iter_batches(batch_size=BATCH_ROWS, columns=list(columns), use_threads=False):
            decoded += sum(decoded_bytes(batch.column(name)) for name in columns)
            if decoded > max_bytes:
                return "error", f"decodes to more than the {max_bytes:,} bytes a submission may have"
            for name in columns:
                out[name] += batch.column(name).to_pylist()
        return "ok", out
    except Exception as exc:  # pyarrow raises many types for damaged files
        return "error", f"not a readable Parquet file ({type(exc).__name__})"
