"""Reading a submitted Parquet file in a child process: pyarrow can abort the whole process on some damaged files
(SIGABRT from a C++ check), so the scorer never parses untrusted Parquet in its own process. This module imports
pyarrow only, so the child starts fast."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

BATCH_ROWS = 4096


def read_columns(raw: bytes, columns: tuple[str, ...], max_rows: int, max_bytes: int) -> tuple[str, Any]:
    """("ok", {column: values}), ("columns", names found) or ("error", why): the row limit is checked from the
    footer, the decoded size batch by batch, so a small file that decodes to gigabytes stops early."""
    try:
        handle = pq.ParquetFile(pa.BufferReader(raw))
        if handle.metadata.num_rows > max_rows:
            return "error", f"{handle.metadata.num_rows:,} rows, more than the {max_rows:,} a submission may have"
        names = list(handle.schema_arrow.names)
        if sorted(names) != sorted(columns) or len(names) != len(set(names)):
            return "columns", names
        batches, decoded = [], 0
        for batch in handle.iter_batches(batch_size=BATCH_ROWS, columns=list(columns)):
            decoded += batch.nbytes
            if decoded > max_bytes:
                return "error", f"decodes to more than the {max_bytes:,} bytes a submission may have"
            batches.append(batch)
        table = pa.Table.from_batches(batches) if batches else handle.read(columns=list(columns))
        return "ok", {name: table.column(name).to_pylist() for name in columns}
    except Exception as exc:  # pyarrow raises many types for damaged files
        return "error", f"not a readable Parquet file ({type(exc).__name__})"
