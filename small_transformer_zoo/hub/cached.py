"""What the `datasets` cache hands back for a zoo split, checked against the zoo's own files.

`datasets` keeps a prepared split as an Arrow file and maps it on every later load without reading the zoo again,
so a change to that file after it was written would be served as if it were the zoo. "always" checks every row's
weights against its digest and every metadata column against the zoo's checked metadata on each load; "once"
does so the first time this machine meets a version of the cache file (a stamp keeps its size, mtime, ctime and
inode, as for shards), and stamps a file this process has just written without reading it back.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

import datasets
import numpy as np
import pyarrow as pa

from ..errors import ZooDamagedError, ZooFormatError
from ..format.shards import check_row_digests
from ..store.reader import ROW_CHECK_CHUNK
from ..store.verification import is_stamped, stamp


def check_cache(data: datasets.Dataset, builder: Any, split: str, verify: str, written_after: float) -> None:
    """Check a split `datasets` returned, per `verify` ("never": not at all). `written_after`: a time (`time.time()`)
    taken before this process prepared the cache; a cache file changed since then was written by the checked
    generator just now and is stamped as it is."""
    if verify == "never":
        return
    key = cache_key(builder, split)
    files = [f["filename"] for f in data.cache_files]
    states = [os.stat(f) for f in files]
    if verify == "once":
        fresh = [st.st_ctime >= written_after for st in states]
        if all(fresh or is_stamped(f, st, key) for f, st, fresh in zip(files, states, fresh)):
            for f, st in zip(files, states):
                stamp(f, st, key)
            return
    check_cached_split(data, builder, split)
    for f, st in zip(files, states):
        stamp(f, st, key)


def cache_key(builder: Any, split: str) -> str:
    """What a cached split must match: the split's metadata and shards (by sha256) and the builder's selection."""
    manifest = builder.manifest
    parts = [manifest["metadata"][split]["sha256"], *(s["sha256"] for s in manifest["shards"] if s["split"] == split),
             json.dumps(builder.config.selection, sort_keys=True)]
    return "datasets-cache:" + hashlib.sha256("\n".join(parts).encode()).hexdigest()


def check_cached_split(data: datasets.Dataset, builder: Any, split: str) -> None:
    """What the `datasets` cache returned for a split against the zoo's files: each row's weights against its
    digest and every metadata column against the checked metadata (a number the zoo does not know is NaN in both)."""
    expected = builder.expected_rows(split)
    folder = os.path.dirname(data.cache_files[0]["filename"]) if data.cache_files else "the cache"
    where = f"the datasets cache of {builder.zoo_root}/{builder.config.name}/{split} ({folder})"
    remedy = f"the cache was altered or damaged after it was written: delete {folder} and load again"
    if data.num_rows != expected.num_rows:
        raise ZooDamagedError(where, f"holds {data.num_rows} rows, the zoo selects {expected.num_rows}; {remedy}")
    table = data.data.table
    for column in expected.column_names:
        if not same_column(table.column(column), expected.column(column)):
            raise ZooDamagedError(where, f"column {column!r} differs from the zoo's metadata; {remedy}")
    for start in range(0, data.num_rows, ROW_CHECK_CHUNK):
        chunk = table.slice(start, ROW_CHECK_CHUNK)
        block = chunk.column("params").combine_chunks().flatten().to_numpy().reshape(chunk.num_rows, -1)
        digests, ids = chunk.column("params_digest").to_pylist(), chunk.column("checkpoint_id").to_pylist()
        try:
            check_row_digests(block, digests, ids, where)
        except ZooFormatError as exc:
            raise ZooDamagedError(where, f"{exc.problem.split(':')[0]}; {remedy}") from None


def same_column(got: pa.ChunkedArray, expected: pa.ChunkedArray) -> bool:
    """Equal values, with NaN equal to NaN and a null equal to NaN in a number column (`datasets` may hand back
    either for a value the zoo does not know)."""
    if got.type != expected.type:
        return False
    if pa.types.is_floating(got.type):
        a = got.to_numpy(zero_copy_only=False).astype(np.float64)
        b = expected.to_numpy(zero_copy_only=False).astype(np.float64)
        return bool(np.array_equal(a, b, equal_nan=True))
    return got.equals(expected)
