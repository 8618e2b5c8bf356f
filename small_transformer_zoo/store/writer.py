"""ZooWriter: append checkpoints, get whole safetensors shards, metadata Parquet per split and zoo.json.

Every data file is named after its content (`weights/train-00000-<sha256 prefix>.safetensors`), written under a
temporary name and renamed into place; zoo.json is written last, by one atomic rename. So a new version of a zoo
never touches a file the old manifest names: until the rename the folder is the old zoo, after it the new one,
and a writer killed at any point leaves one or the other. Files no manifest names any more are removed last.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from safetensors.numpy import save as safetensors_save

from ..format.architecture import ArchitectureSpec
from ..errors import ZooFormatError
from ..format.checksums import sha256_bytes
from .files import atomic_write_bytes, atomic_write_json, check_real_folders, check_stz_home, exclusive_lock
from ..format.manifest import (FORMAT_NAME, FORMAT_VERSION, MANIFEST_NAME, base_provenance, check_new_config_name,
                               load_manifest)
from ..format.invariants import finite_unless_diverged, new_checkpoint_id, one_best_per_run
from ..format.metadata import build_table, normalise_row
from .local_index import register_local_zoo
from .card import write_root_card
from ..format.shards import canonical_header, encode_shard, row_digest
from ..format.splits import DEFAULT_FRACTIONS, DEFAULT_SPLIT_SALT, SPLIT_NAMES, SplitRule
from ..weights.weight_space import pack_state_dict

DEFAULT_SHARD_SIZE = 2048


class ZooWriter:
    """Write one zoo config (`<root>/<config>/`); use as a context manager or call `close()`.

    Rows go to the split of their run, or of their run's family (`SplitRule`, `split_by`); each split's rows fill shards of `shard_size`
    checkpoints named `weights/<split>-<index>-<h>.safetensors` (`<h>`: the start of the file's sha256), so one
    split is a short list of whole files.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        config: str,
        spec: ArchitectureSpec,
        *,
        task: Mapping[str, Any] | None = None,
        provenance: Mapping[str, Any] | None = None,
        grid: Mapping[str, Any] | None = None,
        checkpoint_epochs: list[Any] | None = None,
        shard_size: int = DEFAULT_SHARD_SIZE,
        fractions: Mapping[str, float] = DEFAULT_FRACTIONS,
        split_salt: str = DEFAULT_SPLIT_SALT,
        split_by: str = "run",
        overwrite: bool = False,
        register: bool = True,
    ) -> None:
        check_new_config_name(config)
        if register:
            check_stz_home()
        if shard_size < 1:
            raise ValueError(f"shard_size must be positive, got {shard_size}")
        self.split_rule = SplitRule(split_by, fractions, split_salt)
        self.root, self.config, self.spec = Path(root), config, spec
        self.dir = self.root / config
        for folder in ("", *DATA_FOLDERS):
            check_real_folders(self.root, Path(config) / folder)
        self._lock = exclusive_lock(self.root, config, "ZooWriter")
        self._lock.__enter__()  # held until close(): no other writer may interleave its files and manifest
        if (self.dir / MANIFEST_NAME).exists() and not overwrite:
            self._release()
            raise FileExistsError(f"{self.dir / MANIFEST_NAME}: a zoo already exists here; "
                                  f"pass overwrite=True (--overwrite) to replace it")
        self.overwrite = overwrite
        self.shard_size, self.register = shard_size, register
        self.task, self.grid, self.checkpoint_epochs = dict(task or {}), grid, checkpoint_epochs
        self.provenance = {**base_provenance(), **dict(provenance or {})}
        self._layout = spec.parameters()
        self._buffers: dict[str, list[np.ndarray]] = {s: [] for s in SPLIT_NAMES}
        self._pending_rows: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLIT_NAMES}
        self._rows: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLIT_NAMES}
        self._shards: list[dict[str, Any]] = []
        self._extras: dict[str, dict[str, np.ndarray]] = {}
        self._ids: set[str] = set()
        self._best_runs: set[str] = set()
        self._written: list[str] = []  # data files this writer wrote, removed if it fails
        self._closed = False

    def __enter__(self) -> "ZooWriter":
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        """Close (unless the block did) when the block ends normally; otherwise remove what this writer wrote
        (`_discard`). The lock goes however it ends."""
        if exc_type is None and not self._closed:
            self.close()
        elif exc_type is not None:
            self._discard()
        self._release()

    def _discard(self) -> None:
        """After a failed write (a full disk, an error in the caller's block): remove every file this writer wrote
        that no manifest in place names, and the folders it made that are left empty; an earlier zoo stays whole."""
        if self._closed:
            return
        listed = set()
        if (self.dir / MANIFEST_NAME).is_file():
            try:
                manifest = load_manifest(self.dir)
            except ZooFormatError:
                return  # which files a damaged manifest names is unknown: remove nothing
            listed = {info["path"] for info in [*manifest["metadata"].values(), *manifest["shards"],
                                                *manifest.get("extras", [])]}
        for relpath in self._written:
            if relpath not in listed:
                (self.dir / relpath).unlink(missing_ok=True)
        for folder in [*(self.dir / f for f in DATA_FOLDERS), self.dir]:
            if folder.is_dir() and not folder.is_symlink() and not any(folder.iterdir()):
                folder.rmdir()

    def _release(self) -> None:
        if self._lock is not None:
            lock, self._lock = self._lock, None
            lock.__exit__(None, None, None)

    def add(self, weights: Mapping[str, Any] | np.ndarray | torch.Tensor, metadata: Mapping[str, Any]) -> str:
        """Append one checkpoint (a state_dict or a packed row) with its metadata; returns its checkpoint_id."""
        if self._closed:
            raise RuntimeError("ZooWriter is closed")
        where = f"checkpoint {metadata.get('checkpoint_id') or metadata.get('run_id')!r}"
        row = normalise_row(metadata, where)
        new_checkpoint_id(self._ids, row["checkpoint_id"], where, ValueError)
        if isinstance(weights, Mapping):
            packed = pack_state_dict(weights, self.spec, where)
        else:
            packed = np.asarray(weights.detach().cpu() if isinstance(weights, torch.Tensor) else weights,
                                 dtype=np.float32).reshape(-1)
            if packed.shape[0] != self.spec.n_params:
                raise ValueError(f"{where}: packed row has {packed.shape[0]} values, the architecture has "
                                 f"{self.spec.n_params}")
        finite_unless_diverged(packed[None], [row["diverged"]], [row["checkpoint_id"]], where, ValueError)
        if row["is_best"]:
            best = [row["run_id"]] * (2 if row["run_id"] in self._best_runs else 1)
            one_best_per_run(best, [True] * len(best), where, ValueError)
            self._best_runs.add(row["run_id"])
        split = self.split_rule.assign(row)
        row["split"], row["params_digest"] = split, row_digest(packed)
        self._ids.add(row["checkpoint_id"])
        self._buffers[split].append(packed)
        self._pending_rows[split].append(row)
        if len(self._buffers[split]) >= self.shard_size:
            self._flush(split)
        return row["checkpoint_id"]

    def add_extra(self, name: str, tensors: Mapping[str, Any]) -> None:
        """A frozen part shared by every checkpoint (the text embedding table), stored once in `extras/`."""
        self._extras[name] = {k: np.ascontiguousarray(np.asarray(v)) for k, v in tensors.items()}

    def _flush(self, split: str) -> None:
        buffer = self._buffers[split]
        if not buffer:
            return
        index = sum(1 for s in self._shards if s["split"] == split)
        data = encode_shard(np.stack(buffer), self._layout, self.config)
        relpath = self._write(f"weights/{split}-{index:05d}", ".safetensors", data)
        self._shards.append({"path": relpath, "split": split, "rows": len(buffer), "bytes": len(data),
                             "sha256": sha256_bytes(data)})
        for i, row in enumerate(self._pending_rows[split]):
            row["shard"], row["row"] = relpath, i
        self._rows[split].extend(self._pending_rows[split])
        self._buffers[split], self._pending_rows[split] = [], []

    def _write(self, stem: str, suffix: str, data: bytes) -> str:
        relpath = content_addressed(stem, suffix, data)
        self._written.append(relpath)
        atomic_write_bytes(self.dir / relpath, data)
        return relpath

    def close(self) -> dict[str, Any]:
        """Flush the last shards, write metadata, extras and finally zoo.json; returns the manifest. The writer's
        lock is let go however this ends; a failure removes what this writer wrote (`_discard`)."""
        if self._closed:
            raise RuntimeError("ZooWriter is already closed")
        try:
            return self._close()
        except BaseException:
            self._discard()
            raise
        finally:
            self._release()

    def _close(self) -> dict[str, Any]:
        for split in SPLIT_NAMES:
            self._flush(split)
        metadata_files = {}
        for split in SPLIT_NAMES:
            mark_duplicates(self._rows[split])
            sink = parquet_bytes(build_table(self._rows[split]))
            relpath = self._write(f"metadata/{split}", ".parquet", sink)
            metadata_files[split] = {"path": relpath, "rows": len(self._rows[split]), "bytes": len(sink),
                                     "sha256": sha256_bytes(sink)}
        extras = []
        for name, tensors in sorted(self._extras.items()):
            data = canonical_header(safetensors_save(tensors))
            relpath = self._write(f"extras/{name}", ".safetensors", data)
            extras.append({"name": name, "path": relpath, "bytes": len(data), "sha256": sha256_bytes(data),
                           "tensors": {k: list(v.shape) for k, v in tensors.items()}})
        all_rows = [row for split in SPLIT_NAMES for row in self._rows[split]]
        manifest = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "config": self.config,
            "task": self.task,
            "architecture": self.spec.to_dict(),
            "n_params": self.spec.n_params,
            "dtype": "float32",
            "layout": "packed",
            "parameters": [p.to_dict() for p in self._layout],
            "provenance": self.provenance,
            "grid": self.grid,
            "checkpoint_epochs": self.checkpoint_epochs,
            "splits": self.split_rule.to_manifest(),
            "counts": {"checkpoints": len(all_rows), "runs": len({r["run_id"] for r in all_rows}),
                       **{split: len(self._rows[split]) for split in SPLIT_NAMES}},
            "metadata": metadata_files,
            "shards": self._shards,
            "extras": extras,
        }
        atomic_write_json(self.dir / MANIFEST_NAME, manifest)
        self._closed = True
        remove_unlisted_files(self.dir, manifest)
        self._release()  # the zoo is in place: card and registry need no lock
        write_root_card(self.root)
        if self.register:
            register_local_zoo(self.config, self.root)
        return manifest


def mark_duplicates(rows: list[dict[str, Any]]) -> None:
    """`duplicate_of` of each row: the first earlier row with the same weights (`params_digest`), else None."""
    first: dict[str, str] = {}
    for row in rows:
        row["duplicate_of"] = first.get(row["params_digest"])
        first.setdefault(row["params_digest"], row["checkpoint_id"])


def parquet_bytes(table: Any) -> bytes:
    """A metadata table as the zstd-compressed Parquet bytes every zoo writer stores."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd")
    return sink.getvalue().to_pybytes()


def content_addressed(stem: str, suffix: str, data: bytes) -> str:
    """The relative path a data file is stored under: its stem, the first 16 hex digits of its sha256, its suffix.
    Equal names mean equal bytes, so writing a new version never changes a file that a reader may be reading."""
    return f"{stem}-{sha256_bytes(data)[:16]}{suffix}"


DATA_FOLDERS = ("weights", "metadata", "extras")


def remove_unlisted_files(config_dir: Path, manifest: Mapping[str, Any]) -> None:
    """Remove what the manifest does not name from the data folders: an earlier version's files and a killed
    writer's leftovers. Readers that opened the earlier version keep reading it through their open files."""
    listed = {info["path"] for info in [*manifest["metadata"].values(), *manifest["shards"],
                                        *manifest.get("extras", [])]}
    for folder in DATA_FOLDERS:
        path = config_dir / folder
        check_real_folders(config_dir, Path(folder))
        if not path.is_dir():
            continue
        for child in path.iterdir():
            if f"{folder}/{child.name}" not in listed:
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        if not any(path.iterdir()):
            path.rmdir()
    for leftover in config_dir.glob(f".{MANIFEST_NAME}.*.tmp"):  # a manifest whose writer was killed mid-write
        leftover.unlink()
