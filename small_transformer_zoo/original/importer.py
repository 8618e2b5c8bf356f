"""`stz import-original`: the authors' release converted into this format, resumably.

The CSV is the index: its rows are imported in CSV order, and `.pt` files without a row (the release dropped
duplicate rows) are counted and skipped. Checkpoints are converted in parts of `part_size` rows; each part is one
safetensors file (the packed rows, their metadata as JSON in its header) under `<out>/<config>/.import/parts/`,
written under a temporary name and renamed. An import killed part-way and run again keeps every part whose
metadata equals what the CSV says now and converts the rest; then the parts are written, in CSV order, as the zoo.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save as safetensors_save

from ..format.architecture import ArchitectureSpec
from ..devices import usable_cores
from ..errors import ZooArgumentError, ZooDamagedError
from ..format.checksums import sha256_bytes
from ..format.manifest import MANIFEST_NAME, check_new_config_name, load_manifest
from ..store.files import atomic_write_bytes, atomic_write_json, exclusive_lock
from ..weights.weight_space import pack_state_dict
from ..store.writer import DEFAULT_SHARD_SIZE, ZooWriter
from .checkpoints import (
    POSITIONS,
    WORD_TABLE,
    frozen_tables,
    infer_spec,
    load_state_dict,
    positions_match_model,
    zoo_weights,
)
from .index import IndexRow, read_index
from .release import TABLE_LIMIT, Release, open_reader, open_release, read_member

PART_SIZE = 1000
TASK_CLASSES = {"mnist": 10, "agnews": 4}
Progress = Callable[[int, int], None]


@dataclass
class ImportResult:
    """What an import wrote and what the user should know about it."""

    manifest: dict[str, Any]
    files_without_row: int
    parts_kept: int
    notes: list[str] = field(default_factory=list)


def import_original(source: str | os.PathLike[str], out_root: str | os.PathLike[str], config: str, *,
                    task: str | None = None, shard_size: int = DEFAULT_SHARD_SIZE, overwrite: bool = False,
                    part_size: int = PART_SIZE, workers: int | None = None, progress: Progress | None = None,
                    split_by: str = "run") -> ImportResult:
    """Convert the release at `source` (folder, zip or `hf://datasets/.../<file>.zip`) into `<out_root>/<config>`:
    `workers`: processes converting parts at once (default: one per usable core, at most one per part);
    `split_by`: "run", or "family" to keep the release's near-clones (one seed for all runs) in one split."""
    out_root = Path(out_root)
    check_new_config_name(config)
    with open_release(source, task) as release:
        csv_where = release.where(release.csv_member)
        csv_bytes = release.read(release.csv_member, TABLE_LIMIT)
        rows, columns = read_index(csv_bytes, csv_where)
        absent = [row for row in rows if row.file_name not in release.checkpoints]
        if absent:
            more = f" ({len(absent)} rows name files that are not there)" if len(absent) > 1 else ""
            raise ZooDamagedError(csv_where, f"line {absent[0].line} names {absent[0].file_name!r}, which is not in "
                                            f"{release.where(release.folder)}{more}")
        listed = {row.file_name for row in rows}
        files_without_row = sum(1 for name in release.checkpoints if name not in listed)
        frozen, spec = _architecture(release, rows[0], columns, csv_where)
        notes = _notes(release, spec, frozen, files_without_row)
        plan = {"release_csv_sha256": sha256_bytes(csv_bytes), "part_size": part_size, "architecture": spec.to_dict(),
                **({"split_by": split_by} if split_by != "run" else {})}  # a run split's plan is as it always was
        with exclusive_lock(out_root, config, "stz import-original"):
            work = out_root / config / ".import"
            finished = _finished(out_root / config, work, plan)
            if finished is not None:  # an import killed after its zoo was in place: only the cleanup was left
                shutil.rmtree(work, ignore_errors=True)
                return ImportResult(finished, files_without_row, 0, notes)
            with ZooWriter(
                out_root, config, spec, shard_size=shard_size, overwrite=overwrite, split_by=split_by,
                task={"name": release.task, "source": f"the authors' release ({release.dataset})"},
                provenance={"imported_from": _source_name(source), "release_csv": release.csv_member,
                            "release_csv_sha256": sha256_bytes(csv_bytes), "files_without_row": files_without_row,
                            "positions_match_model": positions_match_model(spec, frozen[POSITIONS]),
                            "notes": notes},
                checkpoint_epochs=_epochs(rows)) as writer:
                _claim(work, plan)
                parts, jobs, kept = [], [], 0
                for index, start in enumerate(range(0, len(rows), part_size)):
                    chunk = rows[start:start + part_size]
                    path = work / "parts" / f"{index:05d}.safetensors"
                    parts.append(path)
                    members = [release.checkpoints[r.file_name] for r in chunk]
                    sources = [release.reader.identity(m) for m in members]
                    if _holds(path, chunk, sources, spec):
                        kept += 1
                    else:
                        jobs.append(PartJob(path, members, [r.metadata for r in chunk], sources))
                _convert_parts(release, jobs, frozen, spec, workers, progress, len(rows))
                for path in parts:
                    packed, metadata = _read_part(path)
                    for row, meta in zip(packed, metadata):
                        writer.add(row, meta)
                writer.add_extra("positions", {"table": frozen[POSITIONS].numpy()})
                if WORD_TABLE in frozen:
                    writer.add_extra("embedding", {"table": frozen[WORD_TABLE].numpy()})
                manifest = writer.close()
            shutil.rmtree(work, ignore_errors=True)
    return ImportResult(manifest, files_without_row, kept, notes)


def _architecture(release: Release, first_row: IndexRow, columns: dict[str, set[Any]],
                  csv_where: str) -> tuple[dict[str, Any], ArchitectureSpec]:
    member = release.checkpoints[first_row.file_name]
    first = load_state_dict(release.read(member), release.where(member))
    embedding, embedding_where = None, None
    if release.embedding_member is not None:
        embedding_where = release.where(release.embedding_member)
        embedding = load_state_dict(release.read(release.embedding_member, TABLE_LIMIT), embedding_where)
    frozen = frozen_tables(first, embedding, release.where(member), embedding_where)
    return frozen, infer_spec(first, frozen, columns, csv_where)


def _notes(release: Release, spec: ArchitectureSpec, frozen: dict[str, Any], files_without_row: int) -> list[str]:
    notes = []
    classes = TASK_CLASSES.get(release.task)
    if classes is not None and classes != spec.num_classes:
        notes.append(f"the classifier head has {spec.num_classes} outputs; {release.task} has {classes} classes "
                     f"(the released runs were trained with that head)")
    if not positions_match_model(spec, frozen[POSITIONS]):
        notes.append("the release's position table differs from this package's sinusoid; it is stored in "
                     "the zoo's extras under 'positions' (`Zoo.extras()`): run these checkpoints with it")
    if files_without_row:
        notes.append(f"{files_without_row} .pt files have no CSV row (the release dropped duplicate rows) and were "
                     f"skipped")
    return notes


def _epochs(rows: list[IndexRow]) -> list[Any]:
    numbered = sorted({row.metadata["epoch"] for row in rows if not row.metadata["is_best"]})
    return numbered + (["best"] if any(row.metadata["is_best"] for row in rows) else [])


def _source_name(source: str | os.PathLike[str]) -> str:
    text = os.fspath(source)
    return text if "://" in text else str(Path(text).resolve())


def _finished(config_dir: Path, work: Path, plan: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest of this very import, already in place, when only its cleanup is left (its work folder is
    still there and claims the same plan); else None."""
    try:
        earlier = json.loads((work / "plan.json").read_text())
    except (OSError, ValueError):
        return None
    if earlier != plan or not (config_dir / MANIFEST_NAME).is_file():
        return None
    manifest = load_manifest(config_dir)
    same = manifest.get("provenance", {}).get("release_csv_sha256") == plan["release_csv_sha256"]
    return manifest if same and manifest["architecture"] == plan["architecture"] else None


def _claim(work: Path, plan: dict[str, Any]) -> None:
    """Keep the parts of an earlier run of this same import; refuse those of another."""
    path = work / "plan.json"
    if path.is_file():
        try:
            earlier = json.loads(path.read_text())
        except (OSError, ValueError):
            earlier = None
        if earlier != plan:
            raise ZooArgumentError(work, "holds the parts of another import (another CSV, part size or architecture); "
                                       "delete this folder to start over")
    else:
        atomic_write_json(path, plan)


def _holds(path: Path, chunk: list[IndexRow], sources: list[str], spec: ArchitectureSpec) -> bool:
    """Whether the part at `path` is complete, holds exactly these rows and was converted from these very source
    files (`sources`: their identities); a damaged part, or one whose sources changed, is converted again."""
    if not path.is_file():
        return False
    try:
        with safe_open(str(path), "np") as handle:
            shape = handle.get_slice("rows").get_shape()
            stored = json.loads((handle.metadata() or {}).get("checkpoints", "null"))
            converted_from = json.loads((handle.metadata() or {}).get("sources", "null"))
    except (SafetensorError, OSError, ValueError):
        return False
    if list(shape) != [len(chunk), spec.n_params] or not isinstance(stored, list) or converted_from != sources:
        return False
    return [{k: v for k, v in meta.items() if k != "diverged"} for meta in stored] == [row.metadata for row in chunk]


@dataclass(frozen=True)
class PartJob:
    """One part to convert: where it goes, its members (in CSV order) and their metadata."""

    path: Path
    members: list[str]
    metadata: list[dict[str, Any]]
    sources: list[str]


def _convert_parts(release: Release, jobs: list[PartJob], frozen: dict[str, Any], spec: ArchitectureSpec,
                   workers: int | None, progress: Progress | None, total: int) -> None:
    """Convert the missing parts: in this process, or in worker processes (one part each at a time)."""
    done = total - sum(len(job.members) for job in jobs)
    if progress:
        progress(done, total)
    count = max(1, min(workers or usable_cores(), len(jobs)))
    if count == 1:
        for job in jobs:
            report = (lambda n, base=done: progress(base + n, total)) if progress else None
            convert_part(release.reader, job, frozen, spec, report)
            done += len(job.members)
            if progress:
                progress(done, total)
        return
    context = multiprocessing.get_context("spawn")  # no fork of a process that may hold torch's thread pools
    with ProcessPoolExecutor(count, mp_context=context) as pool:
        futures = [pool.submit(_convert_in_worker, release.location, job, frozen, spec) for job in jobs]
        try:
            for future in as_completed(futures):
                done += future.result()
                if progress:
                    progress(done, total)
        except BaseException:
            pool.shutdown(cancel_futures=True)
            raise


_WORKER_READERS: dict[Path, Any] = {}


def _convert_in_worker(location: Path, job: PartJob, frozen: dict[str, Any], spec: ArchitectureSpec) -> int:
    if location not in _WORKER_READERS:
        _WORKER_READERS[location] = open_reader(location)
    convert_part(_WORKER_READERS[location], job, frozen, spec, None)
    return len(job.members)


def convert_part(reader: Any, job: PartJob, frozen: dict[str, Any], spec: ArchitectureSpec,
                 report: Callable[[int], None] | None) -> None:
    """Load, check and pack one part's checkpoints and write the part file (atomically)."""
    packed = np.empty((len(job.members), spec.n_params), dtype=np.float32)
    metadata = []
    for i, (member, meta) in enumerate(zip(job.members, job.metadata)):
        where = reader.where(member)
        state = load_state_dict(read_member(reader, member), where)
        packed[i] = pack_state_dict(zoo_weights(state, frozen, where), spec, where)
        metadata.append({**meta, "diverged": not bool(np.isfinite(packed[i]).all())})
        if report and i % 64 == 63:
            report(i + 1)
    atomic_write_bytes(job.path, safetensors_save({"rows": packed}, metadata={"checkpoints": json.dumps(metadata),
                                                                           "sources": json.dumps(job.sources)}))


def _read_part(path: Path) -> tuple[np.ndarray, list[dict[str, Any]]]:
    with safe_open(str(path), "np") as handle:
        return handle.get_tensor("rows"), json.loads(handle.metadata()["checkpoints"])
