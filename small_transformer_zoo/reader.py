"""Reading a local zoo: manifest, metadata, memory-mapped weights (the fast path), selections and verification."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from safetensors.numpy import load as safetensors_load

from .architecture import ArchitectureSpec
from .errors import LabelsWithheldError, ZooFormatError
from .files import sha256_bytes
from .manifest import MANIFEST_NAME
from .metadata_checks import load_checked_metadata, withheld_columns
from .selection import normalise_where, where_mask
from .root_card import list_configs
from .shards import ShardHeader, check_layout, memmap_shard, read_header
from .snapshot import open_snapshot
from .verification import check_open_file, check_verify_mode, file_version
from .weight_space import TransformerWeights

Verify = Literal["once", "always", "never"]


@dataclass
class SplitWeights:
    """A split's weights as memory-mapped shard matrices plus its metadata; nothing is copied until used."""

    spec: ArchitectureSpec
    shards: list[torch.Tensor]
    metadata: pa.Table
    global_rows: np.ndarray
    withheld: tuple[str, ...] = ()
    where: str = ""

    def __len__(self) -> int:
        return self.metadata.num_rows

    def rows(self, indices: Iterable[int] | np.ndarray) -> torch.Tensor:
        """Packed weights of the given metadata rows, [len(indices), n_params] (a copy)."""
        wanted = self.global_rows[np.asarray(indices, dtype=np.int64)]
        out = _new_matrix(len(wanted), self.spec.n_params)
        if not len(wanted):
            return out
        if len(self.shards) == 1:
            return torch.index_select(self.shards[0], 0, torch.from_numpy(wanted), out=out)
        bounds = np.cumsum([0] + [s.shape[0] for s in self.shards])
        which = np.searchsorted(bounds, wanted, side="right") - 1
        for shard_index in np.unique(which):
            mask = which == shard_index
            local = torch.from_numpy(wanted[mask] - bounds[shard_index])
            out[torch.from_numpy(np.nonzero(mask)[0])] = self.shards[shard_index][local]
        return out

    def to_tensor(self) -> torch.Tensor:
        """All packed weights of the split in metadata order, one [rows, n_params] tensor.

        A copy out of the memory maps into memory allocated as `_new_matrix` says (benchmarks/bench_loading.py).
        """
        total = sum(s.shape[0] for s in self.shards)
        if not np.array_equal(self.global_rows, np.arange(total)):
            return self.rows(np.arange(len(self)))
        out, start = _new_matrix(total, self.spec.n_params), 0
        for shard in self.shards:  # one thread's memcpy: as fast as torch's two, and never waits for a busy core
            np.copyto(out.numpy()[start : start + shard.shape[0]], shard.numpy())
            start += shard.shape[0]
        return out

    def labels(self, column: str = "test_accuracy") -> torch.Tensor:
        if column in self.withheld:
            raise LabelsWithheldError(self.where, f"column {column!r} is withheld in this public copy of the zoo; "
                                                  f"its values are with the leaderboard's maintainers")
        return torch.from_numpy(self.metadata.column(column).to_numpy(zero_copy_only=False).astype(np.float32))


def extra_name(info: Mapping[str, Any]) -> str:
    """The name an extras entry is stored under (`name`; zoos written before names were content-addressed have
    only the file name)."""
    return str(info.get("name") or Path(info["path"]).stem)


def _new_matrix(rows: int, n_params: int) -> torch.Tensor:
    """An uninitialised float32 [rows, n_params] tensor in memory that numpy allocates: numpy asks the kernel for
    huge pages for large blocks, so filling it takes hundreds of times fewer page faults than memory from
    `torch.empty`, and a split is copied into it at the speed of a plain read of the files."""
    return torch.from_numpy(np.empty((rows, n_params), dtype=np.float32))


class WeightSpaceDataset(torch.utils.data.Dataset):
    """A map-style torch dataset over a split's memory-mapped rows; pair with `WeightSpaceCollator`."""

    def __init__(self, weights: SplitWeights, label: str | None = "test_accuracy") -> None:
        """`label=None`: items without a label (a leaderboard's test split, whose labels are withheld)."""
        self.weights, self.label = weights, label
        self._labels = None if label is None else weights.labels(label)
        self._ids = weights.metadata.column("checkpoint_id").to_pylist()
        self._bounds = np.cumsum([0] + [s.shape[0] for s in weights.shards])

    def __len__(self) -> int:
        return len(self.weights)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = int(self.weights.global_rows[index])
        shard = int(np.searchsorted(self._bounds, row, side="right") - 1)
        item = {"params": self.weights.shards[shard][row - self._bounds[shard]], "checkpoint_id": self._ids[index]}
        if self._labels is not None:
            item[self.label] = self._labels[index]
        return item


class Zoo:
    """One version of a zoo config on local disk (`<root>/<config>/`).

    Opening it opens every file its manifest names (`snapshot`): whatever replaces the zoo afterwards, this object
    reads the version it opened, whole, until `close()` (or garbage collection) lets the files go.
    """

    def __init__(self, config_dir: str | os.PathLike[str]) -> None:
        self.dir = Path(config_dir)
        self._snapshot = open_snapshot(self.dir)
        self.manifest = self._snapshot.manifest
        self.config: str = self.manifest["config"]
        self.spec = ArchitectureSpec.from_dict(self.manifest["architecture"])
        self._layout = self.spec.parameters()
        self._shard_info = {s["path"]: s for s in self.manifest["shards"]}
        self._checked_metadata: dict[str, tuple[tuple[int, ...], pa.Table]] = {}

    def close(self) -> None:
        """Let the files of this version go; reading afterwards is an error."""
        self._snapshot.close()

    def __enter__(self) -> "Zoo":
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    @classmethod
    def open(cls, root: str | os.PathLike[str], config: str | None = None) -> "Zoo":
        """Open `<root>/<config>`; with one config under the root, `config` may be omitted."""
        root = Path(root)
        if config is None:
            if (root / MANIFEST_NAME).is_file():
                return cls(root)
            configs = list_configs(root)
            if len(configs) != 1:
                raise ZooFormatError(root, f"holds configs {configs}; name one" if configs else "holds no zoo config")
            config = configs[0]
        if not (root / config / MANIFEST_NAME).is_file():
            raise ZooFormatError(root, f"unknown config {config!r}; configs here: {list_configs(root)}")
        return cls(root / config)

    def open_file(self, relpath: str) -> BinaryIO:
        """One of this version's files (a path the manifest names), read through the descriptor the zoo holds."""
        return self._snapshot.open(relpath, "file")

    @property
    def splits(self) -> list[str]:
        return list(self.manifest["metadata"])

    def withheld(self, split: str) -> tuple[str, ...]:
        """Metric columns this copy of the zoo holds back in `split` (a leaderboard's public zoo), else ()."""
        self._check_split(split)
        return withheld_columns(self.manifest["metadata"][split], str(self.dir / MANIFEST_NAME))

    def _check_split(self, split: str) -> None:
        if split not in self.manifest["metadata"]:
            raise ZooFormatError(self.dir, f"unknown split {split!r}; this zoo has {self.splits}")

    def metadata(self, split: str) -> pa.Table:
        """The split's metadata: its bytes checked against the manifest's sha256, its values (`metadata_checks`)
        and every (shard, row) reference."""
        self._check_split(split)
        info = self.manifest["metadata"][split]
        path = self.dir / info["path"]
        with self._snapshot.open(info["path"], "metadata file") as handle:
            version = file_version(os.fstat(handle.fileno()))
            cached = self._checked_metadata.get(split)
            if cached is not None and cached[0] == version:  # this very file, unchanged since it was checked
                return cached[1]
            table = load_checked_metadata(handle.read(), info, split, self.manifest["splits"], str(path))
        self._check_references(table, path, split)
        self._checked_metadata[split] = (version, table)
        return table

    def _check_references(self, table: pa.Table, path: Path, split: str) -> None:
        shards = table.column("shard").to_pylist()
        rows = table.column("row").to_numpy()
        limits = {name: info["rows"] for name, info in self._shard_info.items() if info["split"] == split}
        unknown = sorted(set(shards) - set(limits))
        if unknown:
            raise ZooFormatError(path, f"column 'shard' names shards {unknown[:3]} that the manifest does not list "
                                       f"for split {split!r}")
        limit = np.array([limits[s] for s in shards], dtype=np.int64)
        bad = np.nonzero((rows < 0) | (rows >= limit))[0]
        if bad.size:
            i = int(bad[0])
            raise ZooFormatError(path, f"{bad.size} rows point past their shard's end, first: checkpoint "
                                       f"{table.column('checkpoint_id')[i].as_py()!r} -> {shards[i]} row {rows[i]} "
                                       f"(shard has {limit[i]} rows)")

    def shard_paths(self, split: str) -> list[str]:
        self._check_split(split)
        return [s["path"] for s in self.manifest["shards"] if s["split"] == split]

    def _open_shard(self, relpath: str, verify: Verify, map_rows: bool = False) -> tuple[ShardHeader,
                                                                                        torch.Tensor | None]:
        """A shard's header (and, with `map_rows`, its matrix memory-mapped), all through one open handle: what is
        checked against the manifest is what is mapped, even if the path is replaced meanwhile."""
        info, path = self._shard_info[relpath], self.dir / relpath
        with self._snapshot.open(relpath, "weight shard") as handle:
            check_open_file(handle, path, info["bytes"], info["sha256"], verify)
            header = read_header(handle, str(path), info["bytes"])
            check_layout(header, self._layout, str(path))
            if header.rows != info["rows"] or header.n_params != self.spec.n_params:
                raise ZooFormatError(path, f"holds [{header.rows}, {header.n_params}], the manifest says "
                                           f"[{info['rows']}, {self.spec.n_params}]")
            return header, memmap_shard(handle, header) if map_rows else None

    def split_weights(self, split: str, verify: Verify = "once") -> SplitWeights:
        """The fast path: the split's shards memory-mapped, rows in metadata order.

        `verify="once"` checks each shard's sha256 the first time this machine reads it (and again if the file
        changes); "always" checks every time; "never" checks size and header only.
        """
        check_verify_mode(verify)
        table = self.metadata(split)
        tensors, offsets, total = [], {}, 0
        for relpath in self.shard_paths(split):
            header, tensor = self._open_shard(relpath, verify, map_rows=True)
            tensors.append(tensor)
            offsets[relpath] = total
            total += header.rows
        base = np.array([offsets[s] for s in table.column("shard").to_pylist()], dtype=np.int64)
        return SplitWeights(self.spec, tensors, table, base + table.column("row").to_numpy(), self.withheld(split),
                            f"{self.dir}/{split}")

    def select(self, split: str, *, min_accuracy: float | None = None, max_accuracy: float | None = None,
               epochs: Iterable[int] | None = None, best_only: bool = False, include_diverged: bool = False,
               where: Mapping[str, Any] | None = None) -> np.ndarray:
        """Indices of the split's metadata rows that pass the filters: test accuracy range, epochs, best, and
        `where` on any metadata column (`small_transformer_zoo.selection`)."""
        table = self.metadata(split)
        conditions = normalise_where(where)
        by_accuracy = ["test_accuracy"] if min_accuracy is not None or max_accuracy is not None else []
        hidden = sorted(set(self.withheld(split)) & set(list(conditions) + by_accuracy))
        if hidden:
            raise LabelsWithheldError(self.dir, f"columns {hidden} are withheld in split {split!r} of this public "
                                                f"copy; it cannot select by them")
        mask = pa.array(where_mask(table, conditions))
        accuracy = table.column("test_accuracy")
        if min_accuracy is not None:
            mask = pc.and_(mask, pc.fill_null(pc.greater_equal(accuracy, min_accuracy), False))
        if max_accuracy is not None:
            mask = pc.and_(mask, pc.fill_null(pc.less_equal(accuracy, max_accuracy), False))
        if epochs is not None:
            mask = pc.and_(mask, pc.is_in(table.column("epoch"), pa.array(list(epochs), pa.int32())))
        if best_only:
            mask = pc.and_(mask, table.column("is_best"))
        if not include_diverged:
            mask = pc.and_(mask, pc.invert(table.column("diverged")))
        return np.nonzero(mask.to_numpy(zero_copy_only=False))[0]

    def weight_space(self, split: str, **filters: Any) -> tuple[TransformerWeights, pa.Table]:
        """The selected checkpoints of a split in NFN layout, with their metadata rows."""
        weights = self.split_weights(split)
        indices = self.select(split, **filters)
        return TransformerWeights.from_params(weights.rows(indices), self.spec), weights.metadata.take(indices)

    def extras(self) -> dict[str, dict[str, np.ndarray]]:
        """Frozen shared tensors (the text embedding table), checked against the manifest's sha256."""
        out = {}
        for info in self.manifest.get("extras", []):
            with self._snapshot.open(info["path"], "extra file") as handle:
                data = handle.read()
            if sha256_bytes(data) != info["sha256"]:
                raise ZooFormatError(self.dir / info["path"], "sha256 differs from the manifest: the file was "
                                                              "altered or damaged")
            out[extra_name(info)] = safetensors_load(data)
        return out

    def verify(self, progress: Callable[[str], None] | None = None) -> list[str]:
        """Check every file's size and sha256 and every metadata reference; return the problems found."""
        problems, runs_by_split = [], {}
        for split in self.splits:
            try:
                table = self.metadata(split)
            except ZooFormatError as exc:
                problems.append(str(exc))
                continue
            runs_by_split[split] = set(table.column("run_id").to_pylist())
        for shard in self.manifest["shards"]:
            if progress:
                progress(shard["path"])
            try:
                self._open_shard(shard["path"], "always")
            except ZooFormatError as exc:
                problems.append(str(exc))
        try:
            self.extras()
        except ZooFormatError as exc:
            problems.append(str(exc))
        seen: dict[str, str] = {}
        for split, runs in runs_by_split.items():
            for run in sorted(runs & set(seen))[:3]:
                problems.append(f"run {run!r} occurs in splits {seen[run]!r} and {split!r}")
            seen.update(dict.fromkeys(runs, split))
        if len(runs_by_split) == len(self.splits) and len(seen) != self.manifest["counts"]["runs"]:
            problems.append(f"{self.dir / MANIFEST_NAME}: field 'counts.runs' is {self.manifest['counts']['runs']}, "
                            f"the metadata hold {len(seen)} runs")
        return problems

    def summary(self) -> dict[str, Any]:
        """Counts per split and an accuracy summary, for `stz info`."""
        out: dict[str, Any] = {"config": self.config, "path": str(self.dir), "task": self.manifest.get("task"),
                               "n_params": self.spec.n_params, "runs": self.manifest["counts"].get("runs"),
                               "checkpoints": self.manifest["counts"].get("checkpoints"), "splits": {}}
        for split in self.splits:
            table = self.metadata(split)
            acc = table.column("test_accuracy").to_numpy(zero_copy_only=False).astype(float)
            acc = acc[np.isfinite(acc)]
            out["splits"][split] = {
                "checkpoints": table.num_rows,
                "runs": len(set(table.column("run_id").to_pylist())),
                "diverged": int(pc.sum(table.column("diverged")).as_py() or 0),
                "test_accuracy": {k: float(f(acc)) if acc.size else None for k, f in
                                  (("min", np.min), ("median", np.median), ("mean", np.mean), ("max", np.max))},
            }
        return out
