"""A leaderboard's public copy of a zoo: every file as it is, except the metric columns of the held-out splits,
which are null. The manifest lists what is withheld, so a reader asked for it fails with a clear error instead of
returning nulls, and the maintainers score submissions against their own full copy (docs/design.md section 10).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa

from ..errors import ZooArgumentError, ZooDamagedError, ZooNotFoundError
from ..format.checksums import sha256_bytes
from .files import atomic_write_bytes, atomic_write_json
from ..format.manifest import MANIFEST_NAME
from ..format.metadata import METRICS
from .reader import Zoo
from .card import write_root_card
from .configs import list_configs
from .writer import content_addressed, parquet_bytes


def write_public_copy(root: str | os.PathLike[str], out: str | os.PathLike[str],
                      splits: Sequence[str] = ("test",)) -> list[str]:
    """Copy every config of the zoo at `root` to `out` with the metric columns of `splits` withheld; returns the
    configs written. The source is verified in full first, and `out` must be new or empty."""
    root, out = Path(root), Path(out)
    configs = list_configs(root)
    if not configs:
        raise ZooNotFoundError(root, "holds no zoo config (no <config>/zoo.json)")
    if out.exists() and any(out.iterdir()):
        raise ZooArgumentError(out, "not empty; a public copy goes into a new folder")
    for config in configs:
        _copy_config(Zoo.open(root, config), out / config, splits)
    write_root_card(out)
    return configs


def _copy_config(zoo: Zoo, target: Path, splits: Sequence[str]) -> None:
    """Files first, the manifest last: until it is written `target` is no zoo at all."""
    unknown = [s for s in splits if s not in zoo.splits]
    if unknown:
        raise ZooNotFoundError(zoo.dir, f"has no splits {unknown}; its splits are {zoo.splits}")
    problems = zoo.verify()
    if problems:
        raise ZooDamagedError(zoo.dir, f"fails verification, no public copy made: {problems[0]}")
    manifest = copy.deepcopy(zoo.manifest)
    for info in manifest["shards"] + manifest.get("extras", []):
        _link_or_copy(zoo, info["path"], target / info["path"])
    for split, info in manifest["metadata"].items():
        if split not in splits:
            _link_or_copy(zoo, info["path"], target / info["path"])
            continue
        table = zoo.metadata(split)
        for column in METRICS:
            index = table.schema.get_field_index(column)
            table = table.set_column(index, table.schema.field(index), pa.nulls(table.num_rows, pa.float64()))
        data = parquet_bytes(table)
        relpath = content_addressed(f"metadata/{split}", ".parquet", data)
        atomic_write_bytes(target / relpath, data)
        info.update(path=relpath, bytes=len(data), sha256=sha256_bytes(data), withheld=list(METRICS))
    manifest["provenance"] = {**manifest.get("provenance", {}),
                              "public_copy_of": sha256_bytes((zoo.dir / MANIFEST_NAME).read_bytes()),
                              "withheld_splits": list(splits)}
    atomic_write_json(target / MANIFEST_NAME, manifest)


def _link_or_copy(zoo: Zoo, relpath: str, target: Path) -> None:
    """A hard link where the file system allows one (data files are named after their content and never rewritten
    in place), else a copy from the file the zoo holds open, so a replace of the source meanwhile changes nothing."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with zoo.open_file(relpath) as source:
        try:
            os.link(zoo.dir / relpath, target)
            if os.stat(target).st_ino == os.fstat(source.fileno()).st_ino:
                return
            target.unlink()  # the path holds another file than the verified one now
        except OSError:
            pass
        atomic_write_bytes(target, source.read())
