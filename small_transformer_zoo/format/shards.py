"""Packed weight shards: one safetensors file holding `params: float32 [rows, n_params]`.

Why packed rather than one stacked tensor per parameter name: a checkpoint is then one contiguous byte range,
so a single HTTP range request fetches it from the Hub, and a whole split is one memory-mapped matrix per shard
(see `benchmarks/bench_shard_layout.py` and README.md, "The format", for the measurement). Names, shapes and offsets
live in the safetensors `__metadata__` (and in zoo.json), so a shard still describes itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from dataclasses import dataclass
from collections.abc import Sequence
from typing import Any, BinaryIO

import numpy as np
import torch
from safetensors.numpy import save as safetensors_save

from .architecture import ParameterInfo
from .invariants import finite_unless_diverged
from ..errors import ZooDamagedError, ZooNotFoundError

TENSOR_NAME = "params"
MAX_HEADER_BYTES = 100 << 20


@dataclass(frozen=True)
class ShardHeader:
    """Where the packed matrix lies in a shard file."""

    rows: int
    n_params: int
    data_start: int
    data_end: int
    metadata: dict[str, str]

    @property
    def row_bytes(self) -> int:
        return self.n_params * 4


def encode_shard(params: np.ndarray, layout: list[ParameterInfo], config: str) -> bytes:
    """The bytes of a shard file for a [rows, n_params] float32 matrix."""
    if params.ndim != 2 or params.dtype != np.float32:
        raise ValueError(f"shard matrix must be float32 [rows, n_params], got {params.dtype} {params.shape}")
    metadata = {"format": "small-transformer-zoo", "config": config, "layout": layout_json(layout)}
    return canonical_header(safetensors_save({TENSOR_NAME: np.ascontiguousarray(params)}, metadata=metadata))


def layout_json(layout: list[ParameterInfo]) -> str:
    """The parameter layout as a shard's header stores it (names, shapes, offsets in the packed row)."""
    return json.dumps([p.to_dict() for p in layout], separators=(",", ":"))


def read_checked_header(handle: BinaryIO, info: dict[str, Any], layout: list[ParameterInfo], path: str) -> ShardHeader:
    """The one strict reading of a shard's header, on every read path: parsed as `read_header` does, its data ending
    where the manifest's size says the file ends, its matrix the manifest's [rows, n_params] and its stated
    layout the architecture's."""
    header = read_header(handle, path, info["bytes"])
    n_params = sum(p.numel for p in layout)
    if header.rows != info["rows"] or header.n_params != n_params:
        raise ZooDamagedError(path, f"holds [{header.rows}, {header.n_params}], the manifest says "
                                   f"[{info['rows']}, {n_params}]")
    stated = header.metadata.get("layout")
    if stated is not None and stated != layout_json(layout):
        raise ZooDamagedError(path, "the parameter layout in the safetensors header differs from the manifest's "
                                   "architecture")
    return header


def row_digest(row: np.ndarray) -> str:
    """The checksum of one packed row stored in the metadata (`params_digest`): BLAKE2b-128 of its float32
    little-endian bytes. Every read path checks the rows it hands out against it."""
    return hashlib.blake2b(np.ascontiguousarray(row, dtype="<f4").data, digest_size=16).hexdigest()


def check_row_digests(block: np.ndarray, digests: Sequence[str], checkpoint_ids: Sequence[str], path: str,
                      diverged: Sequence[bool]) -> None:
    """Each packed row of `block` [rows, n_params] against the `params_digest` its metadata row holds, and finite
    unless its checkpoint is marked `diverged` (`format.invariants`)."""
    for values, digest, checkpoint in zip(block, digests, checkpoint_ids):
        if row_digest(values) != digest:
            raise ZooDamagedError(path, f"the weights of checkpoint {checkpoint!r} do not match their digest in the "
                                       f"metadata: the shard was altered or damaged, or the metadata points to "
                                       f"another checkpoint's row")
    finite_unless_diverged(block, diverged, checkpoint_ids, path)


def canonical_header(data: bytes) -> bytes:
    """The same safetensors bytes with the header's keys sorted: the library writes its metadata map in a
    per-process order, so without this two identical shards would differ in bytes (and sha256)."""
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    ordered = json.dumps(header, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    if len(ordered) > length:
        raise ValueError(f"sorted safetensors header is longer ({len(ordered)} bytes) than the original ({length})")
    return data[:8] + ordered.ljust(length, b" ") + data[8 + length :]


def read_header(handle: BinaryIO, path: str, file_size: int | None = None) -> ShardHeader:
    """Parse and check a shard's safetensors header; `file_size`, when known, catches truncation."""
    prefix = handle.read(8)
    if len(prefix) != 8:
        raise ZooDamagedError(path, f"not a safetensors shard: file has {len(prefix)} bytes, header needs 8")
    (header_len,) = struct.unpack("<Q", prefix)
    if header_len > MAX_HEADER_BYTES:
        raise ZooDamagedError(path, f"not a safetensors shard: header length {header_len} is implausible")
    raw = handle.read(header_len)
    try:
        header = json.loads(raw)
        entry = header[TENSOR_NAME]
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise ZooDamagedError(path, f"bad safetensors header ({type(exc).__name__}: {exc})") from None
    extra = sorted(set(header) - {TENSOR_NAME, "__metadata__"})
    if extra:
        raise ZooDamagedError(path, f"bad safetensors header: entries {extra[:3]} besides {TENSOR_NAME!r}")
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ZooDamagedError(path, "bad safetensors header: '__metadata__' must map strings to strings")
    if dtype != "F32" or not isinstance(shape, list) or len(shape) != 2 or not all(map(_is_count, shape)):
        raise ZooDamagedError(path, f"tensor '{TENSOR_NAME}' must be F32 [rows, n_params], got {dtype} {shape}")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(map(_is_count, offsets)) or offsets[0] != 0:
        raise ZooDamagedError(path, f"tensor '{TENSOR_NAME}' data_offsets {offsets!r} must be [0, end] in bytes")
    rows, n_params = shape
    start, stop = 8 + header_len, 8 + header_len + offsets[1]
    if offsets[1] != rows * n_params * 4:
        raise ZooDamagedError(path, f"tensor '{TENSOR_NAME}' spans {offsets[1]} bytes, shape {shape} needs "
                                   f"{rows * n_params * 4}")
    if file_size is not None and file_size != stop:
        problem = "truncated" if file_size < stop else "extra bytes"
        raise ZooDamagedError(path, f"{problem}: {file_size} bytes on disk, header says data ends at byte {stop}")
    return ShardHeader(rows, n_params, start, stop, metadata)


def _is_count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def open_header(path: str | os.PathLike[str]) -> ShardHeader:
    """Header of a local shard file, checked against the file's size."""
    path = os.fspath(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as handle:
            return read_header(handle, path, size)
    except FileNotFoundError:
        raise ZooNotFoundError(path, "weight shard is missing") from None


def memmap_shard(source: str | os.PathLike[str] | BinaryIO, header: ShardHeader) -> torch.Tensor:
    """The shard's matrix as a memory-mapped torch tensor: no bytes are read until used. `source` is a path or an
    open file (the mapping then shows that very file, whatever its path points at later).

    Copy-on-write mapping: writing to the tensor never touches the file.
    """
    if header.rows == 0:
        return torch.empty(0, header.n_params)
    array = np.memmap(source, dtype=np.float32, mode="c", offset=header.data_start,
                      shape=(header.rows, header.n_params))
    return torch.from_numpy(array)


def read_rows(handle: BinaryIO, header: ShardHeader, start: int, stop: int) -> np.ndarray:
    """Rows [start, stop) of a shard from any seekable file (local or remote) with one contiguous read."""
    handle.seek(header.data_start + start * header.row_bytes)
    want = (stop - start) * header.row_bytes
    data = handle.read(want)
    if len(data) != want:
        raise ZooDamagedError(getattr(handle, "path", None) or getattr(handle, "name", None),
                             f"truncated: rows {start}..{stop} need {want} bytes, got {len(data)}")
    return np.frombuffer(data, dtype=np.float32).reshape(stop - start, header.n_params)
