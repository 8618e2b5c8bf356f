"""What the `datasets` cache hands back for a zoo split, checked against the zoo's own files.

`datasets` keeps a prepared split as an Arrow file and its description (`dataset_info.json`, row counts
included) beside it, and maps them on every later load without reading the zoo again, so a change to either after
they were written would be served as if it were the zoo. Every check but "never" compares what costs no pass over
the weights on each load: the row count, the features and the checkpoint ids in order against the zoo's
metadata. "always" also checks every row's weights against its digest and every metadata column on each load;
"once" does so the first time this machine meets a version of the cache file (a stamp keeps its size, mtime,
ctime and inode, as for shards), and stamps a file that this very process created in its preparation without
reading it back. No stamp depends on a clock, and a check that finds a difference stamps nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa

from ..errors import ZooDamagedError, ZooFormatError
from ..format.architecture import ArchitectureSpec
from ..format.shards import check_row_digests
from ..store.reader import ROW_CHECK_CHUNK
from ..store.verification import is_stamped, stamp
from .hf_builder import zoo_features


class CacheDamagedError(ZooDamagedError):
    """The `datasets` cache of a split is not what the zoo's files say (derived data: evicted and rebuilt)."""


def cache_files(folder: str | os.PathLike[str]) -> dict[str, tuple[int, int, int, int]]:
    """The Arrow files under a builder's cache folder with their state (inode, size, mtime, ctime in ns): taken
    before and after a preparation, they tell which files the preparation created."""
    out = {}
    for path in Path(folder).glob("*.arrow") if Path(folder).is_dir() else ():
        try:
            st = path.stat()
        except OSError:
            continue
        out[str(path)] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    return out


def check_cache(data: datasets.Dataset, builder: Any, split: str, verify: str, created: set[str]) -> None:
    """Check a split `datasets` returned, per `verify` ("never": not at all). `created`: the cache files this
    process's preparation created just now (written from checked shards), stamped as they are under "once"."""
    if verify == "never":
        return
    expected = builder.expected_rows(split)
    check_cache_description(data, builder, split, expected)
    key = cache_key(builder, split)
    files = [f["filename"] for f in data.cache_files]
    states = [os.stat(f) for f in files]
    if verify == "once" and all(f in created or is_stamped(f, st, key) for f, st in zip(files, states)):
        for f, st in zip(files, states):
            stamp(f, st, key)
        return
    check_cached_split(data, builder, split, expected)
    for f, st in zip(files, states):
        stamp(f, st, key)


def _where(data: datasets.Dataset, builder: Any, split: str) -> tuple[str, str]:
    folder = os.path.dirname(data.cache_files[0]["filename"]) if data.cache_files else "the cache"
    return (f"the datasets cache of {builder.zoo_root}/{builder.config.name}/{split} ({folder})",
            f"the cache was altered or damaged after it was written: delete {folder} and load again")


def check_cache_description(data: datasets.Dataset, builder: Any, split: str, expected: pa.Table) -> None:
    """What the cache says of a split that costs no pass over the weights: its row count, its features and its
    checkpoint ids in order, against the zoo's metadata (a `dataset_info.json` that lies about the row count
    makes `datasets` serve a cut split)."""
    where, remedy = _where(data, builder, split)
    if data.num_rows != expected.num_rows:
        raise CacheDamagedError(where, f"holds {data.num_rows} rows, the zoo selects {expected.num_rows}; {remedy}")
    wanted = zoo_features(ArchitectureSpec.from_dict(builder.manifest["architecture"]))
    if data.features != wanted:
        raise CacheDamagedError(where, f"describes other features than the zoo's; {remedy}")
    if not data.data.table.column("checkpoint_id").equals(expected.column("checkpoint_id")):
        raise CacheDamagedError(where, f"holds other checkpoints, or in another order, than the zoo selects; {remedy}")


def cache_key(builder: Any, split: str) -> str:
    """What a cached split must match: the split's metadata and shards (by sha256) and the builder's selection."""
    manifest = builder.manifest
    parts = [manifest["metadata"][split]["sha256"], *(s["sha256"] for s in manifest["shards"] if s["split"] == split),
             json.dumps(builder.config.selection, sort_keys=True)]
    return "datasets-cache:" + hashlib.sha256("\n".join(parts).encode()).hexdigest()


def check_cached_split(data: datasets.Dataset, builder: Any, split: str, expected: pa.Table) -> None:
    """What the `datasets` cache returned for a split against the zoo's files: each row's weights against its
    digest and every metadata column against the checked metadata (a number the zoo does not know is NaN in both)."""
    where, remedy = _where(data, builder, split)
    if data.num_rows != expected.num_rows:
        raise CacheDamagedError(where, f"holds {data.num_rows} rows, the zoo selects {expected.num_rows}; {remedy}")
    table = data.data.table
    for column in expected.column_names:
        if not same_column(table.column(column), expected.column(column)):
            raise CacheDamagedError(where, f"column {column!r} differs from the zoo's metadata; {remedy}")
    for start in range(0, data.num_rows, ROW_CHECK_CHUNK):
        chunk = table.slice(start, ROW_CHECK_CHUNK)
        block = chunk.column("params").combine_chunks().flatten().to_numpy().reshape(chunk.num_rows, -1)
        digests, ids = chunk.column("params_digest").to_pylist(), chunk.column("checkpoint_id").to_pylist()
        try:
            check_row_digests(block, digests, ids, where, chunk.column("diverged").to_pylist())
        except ZooFormatError as exc:
            raise CacheDamagedError(where, f"{exc.problem.split(':')[0]}; {remedy}") from None


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
