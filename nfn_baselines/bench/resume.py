"""Resuming a stopped `stz bench` run: every finished (model, condition) of a run is kept on disk, so that a run
stopped after hours (a closed laptop, a job's time limit) trains only what it had not finished when started again.

The fits of one run live in `OUT/.resume/<stem>-<fingerprint>/`, one file per (run split, model, condition),
written atomically; processes that save into one run take turns with the one that finishes it (a lock), so no fit
is lost. The fingerprint covers everything the fits depend on: the zoo's manifest (and so every
shard's digest), the request (but not what only changes the scoring: resamples, bootstrap seed, tree threads)
and the versions of this package and torch. A different command, a rebuilt zoo or another torch gets a folder of
its own and trains from scratch; the folder of a run is removed once its results are written.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import shutil
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from small_transformer_zoo import Zoo
from small_transformer_zoo.store.files import atomic_write_bytes, shared_file_update


@dataclass
class Fit:
    """One model, condition and seed: its predictions of every split and how it was chosen."""

    predictions: dict[str, np.ndarray]
    trial: dict[str, Any]
    validation_score: float
    best_epoch: int | None = None  # a neural model's best epoch; a boosted model's rounds kept by early stopping


# Request fields that change only how finished fits are scored or how fast trees train, not the fits themselves.
SCORING_ONLY = ("resamples", "bootstrap_seed", "jobs")
RECORD_FORMAT = 1


@dataclass
class StoredFits:
    """What one (model, condition) of a run produced: the chosen fits per seed, the default trial's fits and the
    scores of every trial when tuned, and the seconds it took to train."""

    fits: list[Fit]
    untuned: list[Fit] | None
    trials: list[dict[str, Any]] | None
    seconds: float


def fingerprint(zoo: Zoo, request: dict[str, Any]) -> str:
    """A digest of what the fits of `request` on `zoo` depend on."""
    from importlib.metadata import version

    what = {"format": RECORD_FORMAT, "manifest": zoo.manifest, "torch": torch.__version__,
            "package": version("small-transformer-zoo"),
            "request": {k: v for k, v in request.items() if k not in SCORING_ONLY}}
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=repr).encode()).hexdigest()[:16]


class FitStore:
    """The finished fits of one `stz bench` run, on disk: under `<out>/.resume/` while the run goes on (a stopped
    run resumes from them), then under `<out>/.fits/` once its results are written (`finish`), so that the same
    command run again reuses every fit and prints its table at once."""

    def __init__(self, folder: Path, kept: Path | None = None) -> None:
        self.folder = Path(folder)
        self.kept = Path(kept) if kept is not None else None

    @classmethod
    def for_run(cls, out: Path, stem: str, zoo: Zoo, request: dict[str, Any]) -> "FitStore":
        name = f"{stem}-{fingerprint(zoo, request)}"
        return cls(Path(out) / ".resume" / name, Path(out) / ".fits" / name)

    def __len__(self) -> int:
        return len(self._records())

    @property
    def finished(self) -> bool:
        """Whether the fits are those of a run that wrote its results (kept), not of a stopped one."""
        return self.kept is not None and self.kept.is_dir() and not self.folder.is_dir()

    def _records(self) -> set[str]:
        return {p.name for folder in (self.folder, self.kept) if folder is not None and folder.is_dir()
                for p in folder.glob("*.npz")}

    def _path(self, salt: str | None, model: str, condition: str) -> Path:
        key = json.dumps([salt, model, condition])
        name = f"{hashlib.sha256(key.encode()).hexdigest()[:20]}.npz"
        if self.kept is not None and (self.kept / name).is_file() and not (self.folder / name).is_file():
            return self.kept / name
        return self.folder / name

    def load(self, salt: str | None, model: str, condition: str, rows: dict[str, int],
             seeds: int) -> StoredFits | None:
        """The stored fits of (salt, model, condition), or None when there are none. A record that is unreadable
        or does not fit the condition (`rows`: the checkpoints of each split; `seeds`: fits per group) is trained
        again, with a warning that names its file."""
        path = self._path(salt, model, condition)
        if not path.is_file():
            return None
        try:
            return _read_record(path, [salt, model, condition], rows, seeds)
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as error:  # JSON errors are ValueErrors
            warnings.warn(f"{path}: the saved fits of {model} on {condition} cannot be used ({error}); training "
                          f"them again", stacklevel=2)
            return None

    def save(self, salt: str | None, model: str, condition: str, *, fits: list[Fit], untuned: list[Fit] | None,
             trials: list[dict[str, Any]] | None, seconds: float) -> None:
        """Keep the fits of (salt, model, condition) (`StoredFits`' fields): written to a temporary name, then
        renamed."""
        arrays: dict[str, np.ndarray] = {}
        groups = {"fits": fits, **({"untuned": untuned} if untuned is not None else {})}
        meta = {"format": RECORD_FORMAT, "key": [salt, model, condition], "seconds": seconds, "trials": trials,
                "groups": {}}
        for group, group_fits in groups.items():
            meta["groups"][group] = [{"trial": f.trial, "validation_score": _number(f.validation_score),
                                      "best_epoch": f.best_epoch} for f in group_fits]
            for i, fit in enumerate(group_fits):
                for split, values in fit.predictions.items():
                    arrays[f"{group}.{i}.{split}"] = np.asarray(values)
        buffer = io.BytesIO()
        np.savez(buffer, meta=np.asarray(json.dumps(meta)), **arrays)
        name = self._path(salt, model, condition).name
        with self._lock("saving fits"):
            finished = self.kept is not None and self.kept.is_dir() and not self.folder.is_dir()
            atomic_write_bytes((self.kept if finished else self.folder) / name, buffer.getvalue())

    def finish(self) -> None:
        """The run's results are written: keep its fits for a rerun of the same command (`.fits/`), and leave no
        resume folder behind."""
        with self._lock("keeping the fits of a finished run"):
            if self.kept is None:
                shutil.rmtree(self.folder, ignore_errors=True)
            elif self.folder.is_dir():
                self.kept.mkdir(parents=True, exist_ok=True)
                for record in self.folder.glob("*.npz"):
                    os.replace(record, self.kept / record.name)
                shutil.rmtree(self.folder, ignore_errors=True)
        _remove_if_empty(self.folder.parent)

    def clear(self) -> None:
        """Remove every fit of the run, resumable or kept (`--fresh`)."""
        with self._lock("removing the fits of a run"):
            shutil.rmtree(self.folder, ignore_errors=True)
            if self.kept is not None:
                shutil.rmtree(self.kept, ignore_errors=True)
        _remove_if_empty(self.folder.parent)

    def _lock(self, purpose: str) -> Any:
        """The run's lock (`<out>/.fits/.<run>.lock`): saves, `finish` and `clear` take turns, so a fit saved while
        another process finishes the run lands among the kept fits, never in a folder being removed."""
        return shared_file_update(self.kept if self.kept is not None else self.folder, purpose)


def _remove_if_empty(folder: Path) -> None:
    try:
        folder.rmdir()
    except OSError:
        pass  # not empty (another run's records), or already gone


def _number(value: float) -> float | None:
    return None if value is None or math.isnan(value) else float(value)


def _read_record(path: Path, key: list[Any], rows: dict[str, int], seeds: int) -> StoredFits:
    with np.load(path, allow_pickle=False) as data:
        meta = json.loads(str(data["meta"]))
        if meta.get("format") != RECORD_FORMAT or meta.get("key") != key:
            raise ValueError(f"it holds {meta.get('key')!r} (format {meta.get('format')!r}), not {key!r}")
        groups: dict[str, list[Fit]] = {}
        for group, entries in meta["groups"].items():
            if len(entries) != seeds:
                raise ValueError(f"{group}: {len(entries)} seed(s), the run asks for {seeds}")
            fits = []
            for i, entry in enumerate(entries):
                predictions = {}
                for split, count in rows.items():
                    values = data[f"{group}.{i}.{split}"]
                    if values.shape[:1] != (count,):
                        raise ValueError(f"{group}.{i}.{split}: {values.shape[:1]} rows, the split has {count}")
                    predictions[split] = values
                score = entry["validation_score"]
                fits.append(Fit(predictions, entry["trial"], math.nan if score is None else float(score),
                                entry["best_epoch"]))
            groups[group] = fits
    return StoredFits(groups["fits"], groups.get("untuned"), meta["trials"], float(meta["seconds"]))
