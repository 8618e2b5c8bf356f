"""The Hugging Face `datasets` builder for zoo configs (a class: `datasets` 5.x runs no loading scripts).

One builder config per zoo config; splits train/validation/test; features are the metadata columns plus
`params`, a fixed-length float32 list of the packed weights, so `with_format("torch")` yields
`[batch, n_params]` tensors. The same code reads a local root and, streaming, an `hf://` root: shards are read
with contiguous range reads, so streaming fetches only the bytes of the rows it yields.
"""

from __future__ import annotations

import hashlib
import math
import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasets.builder import Key

from ..errors import ZooDamagedError, ZooNotFoundError
from ..format.architecture import ArchitectureSpec
from ..format.manifest import MANIFEST_NAME, load_manifest_text
from ..format.invariants import one_id_across_splits
from ..format.metadata import METADATA_SCHEMA
from ..format.metadata_checks import load_checked_metadata, withheld_columns
from ..format.selection import Selection, select_rows
from ..format.shards import check_row_digests, read_checked_header, read_rows
from ..format.splits import SPLIT_NAMES
from ..store.snapshot import open_snapshot
from ..store.verification import check_open_file
from .remote import content_matches, open_hub_or_local

ROWS_PER_TABLE = 256
MIN_PIECES = 16  # row ranges per split at least (`split_pieces`): enough for a typical DataLoader's workers


def zoo_features(spec: ArchitectureSpec) -> datasets.Features:
    """Metadata columns plus `params: List(float32, length=n_params)`."""
    features = datasets.Features.from_arrow_schema(METADATA_SCHEMA)
    features["params"] = datasets.List(datasets.Value("float32"), length=spec.n_params)
    return features


def read_root_manifest(root: str, config: str, download_config: Any = None) -> tuple[dict[str, Any], bytes]:
    """zoo.json of `<root>/<config>` for a local or remote (`hf://`) root."""
    url = f"{root.rstrip('/')}/{config}/{MANIFEST_NAME}"
    try:
        with open_hub_or_local(url, download_config) as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise ZooNotFoundError(url, f"unknown config {config!r}: no zoo manifest at this path") from None
    if content_matches(raw, getattr(handle, "content_address", None)) is False:
        raise ZooDamagedError(url, f"the bytes received do not match the Hub's content address "
                                  f"{handle.content_address} (a damaged transfer); load it again")
    return load_manifest_text(raw, url), raw


@dataclass
class ZooBuilderConfig(datasets.BuilderConfig):
    """`splits` limits which splits are prepared (and so downloaded); None means all."""

    splits: tuple[str, ...] | None = None
    verify: str = "once"
    selection: str = Selection().to_json()  # `Selection.to_json` of the rows to read (the cache key holds it)

    def create_config_id(self, config_kwargs: dict, custom_features: Any = None) -> str:
        """The cache key without `verify`: how a load checks what it reads does not change what the cache holds, so
        every mode reads, and checks (`hub.cached`), the same cached split."""
        return super().create_config_id({k: v for k, v in config_kwargs.items() if k != "verify"}, custom_features)


class SmallTransformerZoo(datasets.ArrowBasedBuilder):
    """Builder for one zoo config at `root` (a local folder or `hf://datasets/<repo>@<revision>`)."""

    BUILDER_CONFIG_CLASS = ZooBuilderConfig

    def __init__(self, root: str, config_name: str, *, token: Any = None, **kwargs: Any) -> None:
        self.zoo_root = str(root).rstrip("/")
        if "://" in self.zoo_root:  # streaming from the Hub, at one commit
            self._snapshot = None
            self.manifest, self.manifest_bytes = read_root_manifest(self.zoo_root, config_name,
                                                                    datasets.DownloadConfig(token=token))
        else:  # a local root (or a Hub snapshot in the cache): one version of it, its files held open
            config_dir = Path(self.zoo_root) / config_name
            if not (config_dir / MANIFEST_NAME).is_file():
                raise ZooNotFoundError(config_dir / MANIFEST_NAME, f"unknown config {config_name!r}: no zoo manifest "
                                                                 f"at this path")
            self._snapshot = open_snapshot(config_dir)
            self.manifest, self.manifest_bytes = self._snapshot.manifest, self._snapshot.raw
        self.spec = ArchitectureSpec.from_dict(self.manifest["architecture"])
        self._layout = self.spec.parameters()
        self._shard_info = {s["path"]: s for s in self.manifest["shards"]}
        splits = kwargs.get("splits")
        unknown = sorted(set(splits or ()) - set(self.manifest["metadata"]))
        if unknown:
            raise ZooNotFoundError(f"{self.zoo_root}/{config_name}",
                                 f"unknown split {unknown[0]!r}; this zoo has {list(self.manifest['metadata'])}")
        arguments = dict(config_name=config_name, hash=hashlib.sha256(self.manifest_bytes).hexdigest()[:16],
                         base_path=self.zoo_root, dataset_name="small_transformer_zoo", token=token, **kwargs)
        try:
            super().__init__(**arguments)
        except (ValueError, KeyError, TypeError, UnicodeDecodeError):  # its description in the cache is damaged
            folder = getattr(self, "_cache_dir", None)
            if not folder or not (Path(folder) / datasets.config.DATASET_INFO_FILENAME).is_file():
                raise
            warnings.warn(f"{folder}: the datasets cache's description (dataset_info.json) could not be read; it "
                          f"is derived data, so it was deleted and is prepared again from the zoo", stacklevel=3)
            shutil.rmtree(folder, ignore_errors=True)
            super().__init__(**arguments)

    @property
    def wanted_splits(self) -> tuple[str, ...]:
        return self.config.splits or tuple(s for s in SPLIT_NAMES if s in self.manifest["metadata"])

    def _info(self) -> datasets.DatasetInfo:
        return datasets.DatasetInfo(
            description=f"Small Transformer Zoo config {self.manifest['config']!r}: one row per checkpoint, "
                        f"packed weights in 'params' ({self.spec.n_params} float32).",
            features=zoo_features(self.spec),
        )

    def _where(self, relpath: str) -> str:
        """The file's full path or URL (in the config's folder, whatever name its manifest gives the config)."""
        return f"{self.zoo_root}/{self.config.name}/{relpath}"

    def _open(self, relpath: str, what: str, download_config: Any) -> Any:
        """A file of this version: held open since the builder was made (local), or by range requests (Hub)."""
        if self._snapshot is not None:
            return self._snapshot.open(relpath, what)
        return open_hub_or_local(self._where(relpath), download_config)

    def selected_metadata(self, split: str, download_config: Any = None) -> pa.Table:
        """The split's checked metadata rows that this builder's selection picks, in storage order."""
        info = self.manifest["metadata"][split]
        metadata = self._where(info["path"])
        with self._open(info["path"], "metadata file", download_config) as handle:
            raw = handle.read()
        table = load_checked_metadata(raw, self.manifest, split, metadata)
        return table.take(select_rows(table, Selection.from_json(self.config.selection),
                                      withheld_columns(info, metadata), f"{self.zoo_root}/{self.config.name}/{split}"))

    def check_across_splits(self) -> None:
        """The invariants that span splits (`format.invariants`), where every split's metadata is at hand (a local
        root or its Hub snapshot in the cache)."""
        config_dir = Path(self.zoo_root) / self.config.name
        if self._snapshot is None or not all((config_dir / i["path"]).is_file() for i in self.manifest["metadata"].values()):
            return
        ids = {}
        for split, info in self.manifest["metadata"].items():
            with self._snapshot.open(info["path"], "metadata file") as handle:
                table = load_checked_metadata(handle.read(), self.manifest, split, self._where(info["path"]))
            ids[split] = table.column("checkpoint_id").to_pylist()
        one_id_across_splits(ids, f"{self.zoo_root}/{self.config.name}/{MANIFEST_NAME}")

    def expected_rows(self, split: str) -> pa.Table:
        """The metadata columns of the rows a prepared split must hold, as `datasets` hands them out."""
        return nulls_filled(self.selected_metadata(split))

    def _split_generators(self, dl_manager: Any) -> list[datasets.SplitGenerator]:
        return [datasets.SplitGenerator(name=split, gen_kwargs={
            "split": split, "pieces": split_pieces([s for s in self.manifest["shards"] if s["split"] == split]),
            "download_config": dl_manager.download_config}) for split in self.wanted_splits]

    def _generate_tables(self, split: str, pieces: list[tuple[str, int, int]],
                         download_config: Any) -> Iterator[tuple[Key, pa.Table]]:
        """The selected rows of `pieces` (this worker's share of the split's row ranges, `split_pieces`). The
        checks are those of every read path: the metadata's (`format.metadata_checks`), each shard's header, a
        local shard's sha256 (per `verify`), and every row against its digest as it is read (a remote file cannot
        be hashed before it is read whole, and a local one may be altered in place after its sha256 was
        checked)."""
        table = self.selected_metadata(split, download_config)
        shard_column = np.asarray(table.column("shard").to_pylist(), dtype=object)
        row_column = table.column("row").to_numpy()
        check_rows = self.config.verify != "never"
        for piece_index, (name, first, stop) in enumerate(pieces):
            positions = np.nonzero((shard_column == name) & (row_column >= first) & (row_column < stop))[0]
            if positions.size == 0:
                continue
            shard = self._shard_info[name]
            with self._open(name, "weight shard", download_config) as handle:
                if self._snapshot is not None and check_rows:
                    check_open_file(handle, self._where(name), shard["bytes"], shard["sha256"], self.config.verify)
                header = read_checked_header(handle, shard, self._layout, self._where(name))
                batch = table.take(positions)
                block = read_row_runs(handle, header, row_column[positions])
            if check_rows:
                check_row_digests(block, batch.column("params_digest").to_pylist(),
                                  batch.column("checkpoint_id").to_pylist(), self._where(name),
                                  batch.column("diverged").to_pylist())
            yield Key(piece_index, 0), nulls_filled(batch).append_column(
                "params", pa.FixedSizeListArray.from_arrays(pa.array(block.reshape(-1)), header.n_params))


def split_pieces(shards: list[dict[str, Any]]) -> list[tuple[str, int, int]]:
    """A split's rows as (shard, first row, end row) ranges of at most `ROWS_PER_TABLE` rows, and at least
    `MIN_PIECES` ranges where the split has that many rows: `datasets` hands these out to `num_proc` processes
    and to streaming DataLoader workers, so even a split of one shard feeds several workers."""
    total = sum(s["rows"] for s in shards)
    size = max(1, min(ROWS_PER_TABLE, math.ceil(total / MIN_PIECES)))
    return [(s["path"], start, min(start + size, s["rows"])) for s in shards for start in range(0, s["rows"], size)]


def nulls_filled(table: pa.Table) -> pa.Table:
    """Rows as `datasets` hands them out: a value the zoo does not know (null in the metadata) is NaN in a number
    column, -1 in an integer column and "" in a text column, so that torch's default collate takes any batch of
    them."""
    columns = []
    for field, data in zip(table.schema, table.columns):
        if data.null_count:
            fill = float("nan") if pa.types.is_floating(field.type) else -1 if pa.types.is_integer(field.type) \
                else "" if pa.types.is_string(field.type) else None
            if fill is not None:
                data = pc.fill_null(data, pa.scalar(fill, field.type))
        columns.append(data)
    return pa.Table.from_arrays(columns, schema=table.schema)


def read_row_runs(handle: Any, header: Any, rows: np.ndarray) -> np.ndarray:
    """The given (sorted) rows of a shard, one contiguous read per run of consecutive rows: a selection fetches
    only its own rows' bytes."""
    runs = np.split(rows, np.nonzero(np.diff(rows) != 1)[0] + 1)
    return np.concatenate([read_rows(handle, header, int(run[0]), int(run[-1]) + 1) for run in runs])


def builder_for(root: str, config: str, *, splits: tuple[str, ...] | None = None, verify: str = "once",
                cache_dir: str | None = None, token: Any = None,
                selection: Selection | None = None) -> SmallTransformerZoo:
    """A builder for `<root>/<config>`, limited to `splits` and to the rows `selection` picks."""
    return SmallTransformerZoo(root, config, splits=splits, verify=verify, cache_dir=cache_dir, token=token,
                               selection=(selection or Selection()).to_json())

