"""Reading a local zoo: manifest, metadata, memory-mapped weights (the fast path), selections and verification."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from safetensors.numpy import load as safetensors_load

from ..format.architecture import ArchitectureSpec
from ..errors import LabelsWithheldError, ZooDamagedError, ZooFormatError, ZooNotFoundError
from ..format.manifest import MANIFEST_NAME
from ..format.metadata_checks import load_checked_metadata, withheld_columns
from ..format.selection import Selection, select_rows
from ..format.splits import SplitRule
from .configs import choose_config, list_configs
from ..format.invariants import one_id_across_splits
from ..format.shards import check_row_digests, memmap_shard, read_checked_header
from .seeding import recipe, seed_policy
from .snapshot import open_snapshot
from ..format.checksums import check_bytes
from .verification import check_open_file, check_verify_mode, file_version, rows_checked, stamp_rows_checked
from ..weights.weight_space import TransformerWeights

Verify = Literal["once", "always", "never"]
ROW_CHECK_CHUNK = 512  # rows copied and digested at a time when a split's rows are checked


class ShardWatch:
    """The shard files of a split as they were when their rows were verified. Rows are read from memory maps
    later, when copied out; a file written to meanwhile (its size, mtime or ctime changed) could reach them, so
    every row copied out after any shard changed is checked against its digest before it is handed out."""

    def __init__(self, handles: list[Any], digests: list[str], ids: list[str], where: str,
                 versions: list[tuple[int, ...]] | None = None, diverged: list[bool] | None = None) -> None:
        """`versions`: the files' versions when their rows were verified (default: as the handles are now)."""
        self._fds = [os.dup(h.fileno()) for h in handles]
        self._versions = versions or [file_version(os.fstat(fd)) for fd in self._fds]
        self._digests, self._ids, self._where = digests, ids, where
        self._diverged = diverged if diverged is not None else [False] * len(ids)
        weakref.finalize(self, _close_all, list(self._fds))

    def __reduce__(self) -> Any:
        raise TypeError("a ShardWatch holds open files: pickle the SplitWeights that owns it, which reopens them")

    def changed(self) -> bool:
        return any(file_version(os.fstat(fd)) != v for fd, v in zip(self._fds, self._versions))

    def check(self, indices: np.ndarray, block: torch.Tensor) -> None:
        """`block` holds the metadata rows `indices`: check them if any shard changed since it was verified."""
        if len(indices) and self.changed():
            check_row_digests(block.numpy(), [self._digests[i] for i in indices], [self._ids[i] for i in indices],
                              f"{self._where} (a shard changed after it was verified)",
                              [self._diverged[i] for i in indices])


@dataclass(frozen=True)
class MappedShard:
    """Where a mapped shard matrix lies, so a copy of `SplitWeights` in another process maps the same file again:
    the path, the matrix's byte offset and shape, and the file's version when it was verified."""

    path: str
    data_start: int
    rows: int
    n_params: int
    version: tuple[int, ...]

    def open(self) -> tuple[BinaryIO, torch.Tensor]:
        """The file, opened again, and its matrix mapped from that very handle."""
        try:
            handle = open(self.path, "rb")
        except OSError as exc:
            raise ZooNotFoundError(self.path, f"cannot be opened again in this process ({exc.strerror}); the zoo "
                                            f"moved or was removed after it was opened") from None
        if self.rows == 0:
            return handle, torch.empty(0, self.n_params)
        if os.fstat(handle.fileno()).st_size < self.data_start + self.rows * self.n_params * 4:
            handle.close()
            raise ZooDamagedError(self.path, "is shorter than when it was verified: it was truncated or replaced")
        array = np.memmap(handle, dtype=np.float32, mode="c", offset=self.data_start, shape=(self.rows, self.n_params))
        return handle, torch.from_numpy(array)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)


@dataclass
class SplitWeights:
    """A split's weights as memory-mapped shard matrices plus its metadata; nothing is copied until used.

    What is copied out (`rows`, `to_tensor`, `WeightSpaceDataset` items) is what was verified: unless the split was
    opened with `verify="never"`, a shard that changed after its check makes every row copied out afterwards be
    checked against its digest."""

    spec: ArchitectureSpec
    shards: list[torch.Tensor]
    metadata: pa.Table
    global_rows: np.ndarray
    withheld: tuple[str, ...] = ()
    where: str = ""
    watch: ShardWatch | None = None
    sources: tuple[MappedShard, ...] = ()  # the files `shards` map, for pickling
    unusable: ZooFormatError | None = None  # why an unpickled copy cannot read (raised at its first read)

    def __len__(self) -> int:
        return self.metadata.num_rows

    def __getstate__(self) -> dict[str, Any]:
        """Pickled by path and file version, never by open file or mapped bytes: a worker process (spawn,
        forkserver) maps the shards again, and if any file differs from the version verified here, every row it
        copies out is checked against its digest."""
        if not self.sources:  # no shard (an empty split): nothing to map again, nothing to watch
            return {k: v for k, v in self.__dict__.items() if k != "watch"} | {"watch": None}
        state = {k: v for k, v in self.__dict__.items() if k not in ("shards", "watch")}
        if self.watch is not None:
            state["watch_rows"] = (self.watch._digests, self.watch._ids, self.watch._where)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        watch_rows = state.pop("watch_rows", None)
        self.__dict__.update(state)
        if "shards" in state:
            return
        handles, self.shards = [], []
        try:
            for source in self.sources:
                handle, tensor = source.open()
                handles.append(handle)
                self.shards.append(tensor)
            self.watch = None if watch_rows is None else ShardWatch(handles, *watch_rows,
                                                                    [s.version for s in self.sources])
        except ZooFormatError as exc:
            # Raised now, it would kill a DataLoader worker as it starts ("exited unexpectedly"): kept, it is
            # raised by the first read, through the worker's own error path, as this kind.
            self.shards, self.watch, self.unusable = [], None, exc
        finally:
            for handle in handles:
                handle.close()

    def rows(self, indices: Iterable[int] | np.ndarray) -> torch.Tensor:
        """Packed weights of the given metadata rows, [len(indices), n_params] (a copy)."""
        self._check_usable()
        indices = np.asarray(indices, dtype=np.int64)
        out = self._copy_rows(self.global_rows[indices])
        if self.watch is not None:
            self.watch.check(indices, out)
        return out

    def _copy_rows(self, wanted: np.ndarray) -> torch.Tensor:
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

    def _check_usable(self) -> None:
        """A copy unpickled where its files could not be opened again raises why, at its first read."""
        if self.unusable is not None:
            raise self.unusable

    def to_tensor(self) -> torch.Tensor:
        """All packed weights of the split in metadata order, one [rows, n_params] tensor.

        A copy out of the memory maps into memory allocated as `_new_matrix` says (benchmarks/bench_loading.py).
        """
        self._check_usable()
        total = sum(s.shape[0] for s in self.shards)
        if not np.array_equal(self.global_rows, np.arange(total)):
            return self.rows(np.arange(len(self)))
        out, start = _new_matrix(total, self.spec.n_params), 0
        for shard in self.shards:  # one thread's memcpy: as fast as torch's two, and never waits for a busy core
            np.copyto(out.numpy()[start : start + shard.shape[0]], shard.numpy())
            start += shard.shape[0]
        if self.watch is not None:
            self.watch.check(np.arange(len(self)), out)
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
    """A map-style torch dataset over a split's memory-mapped rows (each item a checked copy of one row); pair
    with `WeightSpaceCollator`."""

    def __init__(self, weights: SplitWeights, label: str | None = "test_accuracy") -> None:
        """`label=None`: items without a label (a leaderboard's test split, whose labels are withheld)."""
        self.weights, self.label = weights, label
        self._labels = None if label is None else weights.labels(label)
        self._ids = weights.metadata.column("checkpoint_id").to_pylist()

    def __len__(self) -> int:
        return len(self.weights)

    def __getitem__(self, index: int) -> dict[str, Any]:
        item = {"params": self.weights.rows([index])[0], "checkpoint_id": self._ids[index]}
        if self._labels is not None:
            item[self.label] = self._labels[index]
        return item


class Zoo:
    """One version of a zoo config on local disk (`<root>/<config>/`).

    Opening it opens every file its manifest names (`snapshot`): whatever replaces the zoo afterwards, this object
    reads the version it opened, whole, until `close()` (or garbage collection) lets the files go.
    """

    def __init__(self, config_dir: str | os.PathLike[str], verify: Verify = "once") -> None:
        """`verify`: how this zoo's reads check shard contents unless a read says otherwise (`split_weights`)."""
        self.verify_mode = check_verify_mode(verify)
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
    def open(cls, root: str | os.PathLike[str], config: str | None = None, verify: Verify = "once") -> "Zoo":
        """Open the local `<root>/<config>` (or a config folder); with one config under the root, `config` may be
        omitted. Hub repos and the short name open with `open_zoo`."""
        root = Path(root)
        if not root.is_dir():
            raise ZooNotFoundError(root, "no such folder (a Hub repo id or the short name opens with "
                                       "small_transformer_zoo.open_zoo)")
        if config is None and (root / MANIFEST_NAME).is_file():
            return cls(root, verify)
        return cls(root / choose_config(list_configs(root), config, root), verify)

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
            raise ZooNotFoundError(self.dir, f"unknown split {split!r}; this zoo has {self.splits}")

    def metadata(self, split: str) -> pa.Table:
        """The split's metadata, after the checks of every read path (`format.metadata_checks`)."""
        self._check_split(split)
        info = self.manifest["metadata"][split]
        with self._snapshot.open(info["path"], "metadata file") as handle:
            version = file_version(os.fstat(handle.fileno()))
            cached = self._checked_metadata.get(split)
            if cached is not None and cached[0] == version:  # this very file, unchanged since it was checked
                return cached[1]
            table = load_checked_metadata(handle.read(), self.manifest, split, str(self.dir / info["path"]))
        self._checked_metadata[split] = (version, table)
        return table

    def shard_paths(self, split: str) -> list[str]:
        self._check_split(split)
        return [s["path"] for s in self.manifest["shards"] if s["split"] == split]

    def _open_shard(self, relpath: str, verify: Verify,
                    map_rows: bool = False) -> tuple[Any, torch.Tensor | None, MappedShard]:
        """A shard's open file, checked (size, per `verify` its sha256, its header) through that one handle, and
        with `map_rows` its matrix memory-mapped: what is checked is what is mapped, even if the path is replaced
        meanwhile."""
        info, path = self._shard_info[relpath], str(self.dir / relpath)
        with self._snapshot.open(relpath, "weight shard") as handle:
            check_open_file(handle, path, info["bytes"], info["sha256"], verify)
            header = read_checked_header(handle, info, self._layout, path)
            source = MappedShard(str(Path(path).resolve()), header.data_start, header.rows, header.n_params,
                                 file_version(os.fstat(handle.fileno())))
            return handle, memmap_shard(handle, header) if map_rows else None, source

    def split_weights(self, split: str, verify: Verify | None = None) -> SplitWeights:
        """The fast path: the split's shards memory-mapped, rows in metadata order, after the checks of every read
        path: each shard's size, header and sha256, and each row against its metadata digest.

        `verify` (default: the zoo's, "once"): "once" hashes each shard, and checks the rows' digests, the first
        time this machine reads that version of the files (and again if one changes); "always" every time;
        "never" checks sizes and headers only.
        """
        verify = check_verify_mode(verify or self.verify_mode)
        table = self.metadata(split)
        handles, tensors, sources, offsets, total = [], [], [], {}, 0
        for relpath in self.shard_paths(split):
            handle, tensor, source = self._open_shard(relpath, verify, map_rows=True)
            handles.append(handle)
            tensors.append(tensor)
            sources.append(source)
            offsets[relpath] = total
            total += tensor.shape[0]
        base = np.array([offsets[s] for s in table.column("shard").to_pylist()], dtype=np.int64)
        where = f"{self.dir}/{split}"
        weights = SplitWeights(self.spec, tensors, table, base + table.column("row").to_numpy(), self.withheld(split),
                               where, sources=tuple(sources))
        if verify != "never":
            digests, ids = table.column("params_digest").to_pylist(), table.column("checkpoint_id").to_pylist()
            diverged = table.column("diverged").to_pylist()
            content = [self.manifest["metadata"][split]["sha256"]] + [self._shard_info[p]["sha256"]
                                                                       for p in self.shard_paths(split)]
            self.check_across_splits()
            if verify == "always" or not rows_checked(content):
                for start in range(0, len(table), ROW_CHECK_CHUNK):
                    stop = min(start + ROW_CHECK_CHUNK, len(table))
                    block = weights._copy_rows(weights.global_rows[start:stop])
                    check_row_digests(block.numpy(), digests[start:stop], ids[start:stop], where,
                                      diverged[start:stop])
                stamp_rows_checked(content)
            weights.watch = ShardWatch(handles, digests, ids, where, diverged=diverged)
        return weights

    def select(self, split: str, *, min_accuracy: float | None = None, max_accuracy: float | None = None,
               epochs: Iterable[int] | None = None, best_only: bool = False, include_diverged: bool = False,
               distinct: bool = True, where: Mapping[str, Any] | None = None) -> np.ndarray:
        """Indices of the split's metadata rows that the filters pick, in metadata order: the one rule of every
        read path (`small_transformer_zoo.format.selection`), diverged and repeated checkpoints left out unless
        asked for."""
        selection = Selection.of(where, min_accuracy=min_accuracy, max_accuracy=max_accuracy, epochs=epochs,
                                 best_only=best_only, include_diverged=include_diverged, distinct=distinct)
        return select_rows(self.metadata(split), selection, self.withheld(split), f"{self.dir}/{split}")

    def weight_space(self, split: str, verify: Verify | None = None,
                     **filters: Any) -> tuple[TransformerWeights, pa.Table]:
        """The selected checkpoints of a split (`select`'s filters) in NFN layout, with their metadata rows."""
        weights = self.split_weights(split, verify)
        indices = self.select(split, **filters)
        return TransformerWeights.from_params(weights.rows(indices), self.spec), weights.metadata.take(indices)

    def extras(self, verify: Verify | None = None) -> dict[str, dict[str, np.ndarray]]:
        """Frozen shared tensors (the text embedding table), checked against the manifest as `split_weights`
        checks shards (`verify`, default the zoo's)."""
        verify = check_verify_mode(verify or self.verify_mode)
        out = {}
        for info in self.manifest.get("extras", []):
            with self._snapshot.open(info["path"], "extra file") as handle:
                data = handle.read()
            if verify != "never":  # small files: hashed whenever they are read
                check_bytes(data, info["bytes"], info["sha256"], str(self.dir / info["path"]))
            out[extra_name(info)] = safetensors_load(data)
        return out

    def check_across_splits(self) -> None:
        """The invariants that span splits (`format.invariants`): one checkpoint id in the whole zoo."""
        one_id_across_splits({s: self.metadata(s).column("checkpoint_id").to_pylist() for s in self.splits},
                             str(self.dir / MANIFEST_NAME))

    def verify(self, progress: Callable[[str], None] | None = None) -> list[str]:
        """Every check of every read path at once, hashing everything again: each split's metadata, each shard's
        size, header and sha256, each row against its digest, the extras, and runs in one split only; returns the
        problems found. `progress` is called with each shard's path."""
        problems, runs_by_split = [], {}
        for split in self.splits:
            try:
                table = self.metadata(split)
                runs_by_split[split] = set(table.column("run_id").to_pylist())
                for relpath in self.shard_paths(split):
                    if progress:
                        progress(relpath)
                    self._open_shard(relpath, "always")
                self.split_weights(split, "always")
            except ZooFormatError as exc:
                problems.append(str(exc))
        try:
            self.extras("always")
        except ZooFormatError as exc:
            problems.append(str(exc))
        if len(runs_by_split) == len(self.splits):
            try:
                self.check_across_splits()
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
        """Counts per split and an accuracy summary, for `stz info`. `checkpoints` counts the metadata rows;
        `distinct` the distinct checkpoints among them (a run's best checkpoint is a copy of one of its epochs: that
        row is not counted again), which is what reads give by default."""
        out: dict[str, Any] = {"config": self.config, "path": str(self.dir), "task": self.manifest.get("task"),
                               "n_params": self.spec.n_params, "runs": self.manifest["counts"].get("runs"),
                               "checkpoints": self.manifest["counts"].get("checkpoints"),
                               "seed_policy": seed_policy(self.manifest, map(self.metadata, self.splits)),
                               "recipe": recipe(self.manifest),
                               "split_rule": SplitRule.from_manifest(self.manifest["splits"]).describe(), "splits": {}}
        for split in self.splits:
            table = self.metadata(split)
            acc = table.column("test_accuracy").to_numpy(zero_copy_only=False).astype(float)
            acc = acc[np.isfinite(acc)]
            out["splits"][split] = {
                "checkpoints": table.num_rows,
                "distinct": table.column("duplicate_of").null_count,
                "runs": len(set(table.column("run_id").to_pylist())),
                "diverged": int(pc.sum(table.column("diverged")).as_py() or 0),
                "test_accuracy": {k: float(f(acc)) if acc.size else None for k, f in
                                  (("min", np.min), ("median", np.median), ("mean", np.mean), ("max", np.max))},
            }
        out["distinct"] = sum(s["distinct"] for s in out["splits"].values())
        return out
