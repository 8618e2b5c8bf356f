"""The Hugging Face `datasets` builder for zoo configs (a class: `datasets` 5.x runs no loading scripts).

One builder config per zoo config; splits train/validation/test; features are the metadata columns plus
`params`, a fixed-length float32 list of the packed weights, so `with_format("torch")` yields
`[batch, n_params]` tensors. The same code reads a local root and, streaming, an `hf://` root: shards are read
with contiguous range reads, so streaming fetches only the bytes of the rows it yields.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
from datasets.builder import Key
from datasets.download.streaming_download_manager import StreamingDownloadManager

from .architecture import ArchitectureSpec
from .errors import ZooFormatError
from .manifest import MANIFEST_NAME, load_manifest_text
from .metadata import METADATA_SCHEMA
from .metadata_checks import load_checked_metadata
from .remote import content_matches, open_hub_or_local
from .selection import where_mask
from .shards import check_layout, read_header, read_rows, row_digest
from .snapshot import open_snapshot
from .splits import SPLIT_NAMES
from .verification import check_open_file

ROWS_PER_TABLE = 256


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
        raise ZooFormatError(url, f"unknown config {config!r}: no zoo manifest at this path") from None
    if content_matches(raw, getattr(handle, "content_address", None)) is False:
        raise ZooFormatError(url, f"the bytes received do not match the Hub's content address "
                                  f"{handle.content_address} (a damaged transfer); load it again")
    return load_manifest_text(raw, url), raw


@dataclass
class ZooBuilderConfig(datasets.BuilderConfig):
    """`splits` limits which splits are prepared (and so downloaded); None means all."""

    splits: tuple[str, ...] | None = None
    verify: str = "once"
    where: str | None = None  # `selection.where_to_json` of a metadata filter


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
                raise ZooFormatError(config_dir / MANIFEST_NAME, f"unknown config {config_name!r}: no zoo manifest "
                                                                 f"at this path")
            self._snapshot = open_snapshot(config_dir)
            self.manifest, self.manifest_bytes = self._snapshot.manifest, self._snapshot.raw
        self.spec = ArchitectureSpec.from_dict(self.manifest["architecture"])
        self._layout = self.spec.parameters()
        splits = kwargs.get("splits")
        unknown = sorted(set(splits or ()) - set(self.manifest["metadata"]))
        if unknown:
            raise ZooFormatError(f"{self.zoo_root}/{config_name}",
                                 f"unknown split {unknown[0]!r}; this zoo has {list(self.manifest['metadata'])}")
        super().__init__(config_name=config_name, hash=hashlib.sha256(self.manifest_bytes).hexdigest()[:16],
                         base_path=self.zoo_root, dataset_name="small_transformer_zoo", token=token, **kwargs)

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

    def _split_generators(self, dl_manager: Any) -> list[datasets.SplitGenerator]:
        streaming = isinstance(dl_manager, StreamingDownloadManager)
        generators = []
        for split in self.wanted_splits:
            shards = [s for s in self.manifest["shards"] if s["split"] == split]
            if self._snapshot is not None and not streaming and self.config.verify != "never":
                for info in shards:
                    with self._snapshot.open(info["path"], "weight shard") as handle:
                        check_open_file(handle, handle.name, info["bytes"], info["sha256"], self.config.verify)
            generators.append(datasets.SplitGenerator(name=split, gen_kwargs={
                "split": split, "streaming": streaming, "shards": [s["path"] for s in shards],
                "split_shards": tuple(s["path"] for s in shards), "download_config": dl_manager.download_config}))
        return generators

    def _generate_tables(self, split: str, streaming: bool, shards: list[str], split_shards: tuple[str, ...],
                         download_config: Any) -> Iterator[tuple[Key, pa.Table]]:
        """`shards` may be this worker's part of the split's shards; `split_shards` are all of them."""
        info = self.manifest["metadata"][split]
        metadata = self._where(info["path"])
        with self._open(info["path"], "metadata file", download_config) as handle:
            raw = handle.read()
        table = load_checked_metadata(raw, info, split, self.manifest["splits"], metadata)
        shard_column = np.asarray(table.column("shard").to_pylist(), dtype=object)
        # Every name must be one of the split's shards, whichever part of them this worker reads.
        unknown = sorted(set(shard_column) - set(split_shards))
        if unknown:
            raise ZooFormatError(metadata, f"column 'shard' names shards {unknown[:3]} not listed in the manifest")
        if self.config.where:
            table = table.filter(pa.array(where_mask(table, json.loads(self.config.where))))
            shard_column = np.asarray(table.column("shard").to_pylist(), dtype=object)
        row_column = table.column("row").to_numpy()
        # Each row is checked against its digest as it is read: streaming never sees a whole file, and a file may
        # be altered in place after its sha256 was checked.
        check_rows = self.config.verify != "never" and row_checks_possible(table, metadata, streaming)
        for shard_index, name in enumerate(shards):
            positions = np.nonzero(shard_column == name)[0]
            if positions.size == 0:
                continue
            positions = positions[np.argsort(row_column[positions], kind="stable")]
            rows = row_column[positions]
            with self._open(name, "weight shard", download_config) as handle:
                header = read_header(handle, self._where(name))
                check_layout(header, self._layout, self._where(name))
                if rows[0] < 0 or rows[-1] >= header.rows:
                    bad = int(positions[(rows < 0) | (rows >= header.rows)][0])
                    raise ZooFormatError(metadata, f"checkpoint {table.column('checkpoint_id')[bad].as_py()!r} "
                                                   f"points to row {row_column[bad]} of {name}, which has "
                                                   f"{header.rows} rows")
                for batch_index, start in enumerate(range(0, positions.size, ROWS_PER_TABLE)):
                    batch_positions = positions[start : start + ROWS_PER_TABLE]
                    batch_rows = rows[start : start + ROWS_PER_TABLE]
                    block = read_row_runs(handle, header, batch_rows)
                    if check_rows:
                        check_row_digests(block, table.take(batch_positions), name)
                    params = pa.FixedSizeListArray.from_arrays(pa.array(block.reshape(-1)), header.n_params)
                    yield Key(shard_index, batch_index), table.take(batch_positions).append_column("params", params)


def read_row_runs(handle: Any, header: Any, rows: np.ndarray) -> np.ndarray:
    """The given (sorted) rows of a shard, one contiguous read per run of consecutive rows: a selection fetches
    only its own rows' bytes."""
    runs = np.split(rows, np.nonzero(np.diff(rows) != 1)[0] + 1)
    return np.concatenate([read_rows(handle, header, int(run[0]), int(run[-1]) + 1) for run in runs])


def row_checks_possible(table: pa.Table, metadata: str, streaming: bool) -> bool:
    """Whether the metadata has per-row digests; a zoo written without them streams unchecked, and says so."""
    if table.column("params_digest").null_count:
        if streaming:
            warnings.warn(f"{metadata}: this zoo was written without per-row digests, so streaming cannot check its "
                          f"rows; `stz verify` checks every file", stacklevel=2)
        return False
    return True


def check_row_digests(block: np.ndarray, rows: pa.Table, shard: str) -> None:
    """Each packed row against the `params_digest` its metadata row holds."""
    for values, digest, checkpoint in zip(block, rows.column("params_digest").to_pylist(),
                                          rows.column("checkpoint_id").to_pylist()):
        if row_digest(values) != digest:
            raise ZooFormatError(shard, f"the weights of checkpoint {checkpoint!r} do not match their digest in the "
                                        f"metadata: the shard was altered or damaged")


def builder_for(root: str, config: str, *, splits: tuple[str, ...] | None = None, verify: str = "once",
                cache_dir: str | None = None, token: Any = None, where: str | None = None) -> SmallTransformerZoo:
    """A builder for `<root>/<config>`, limited to `splits` and to the rows a `where` filter (JSON) selects."""
    return SmallTransformerZoo(root, config, splits=splits, verify=verify, cache_dir=cache_dir, token=token,
                               where=where)

