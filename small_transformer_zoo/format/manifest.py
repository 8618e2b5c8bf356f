"""zoo.json: the manifest that makes a config folder a zoo, and the checks made when one is opened."""

from __future__ import annotations

import json
import os
import stat
import platform
import re
from datetime import datetime, timezone
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

from .architecture import ArchitectureSpec
from ..errors import ZooDamagedError, ZooNotFoundError
from .splits import SPLIT_NAMES, SplitRule, check_fractions

FORMAT_NAME = "small-transformer-zoo"
FORMAT_VERSION = 1
MANIFEST_NAME = "zoo.json"
SHA256 = re.compile(r"[0-9a-f]{64}")
MAX_COUNT = 2**53  # exact in every JSON reader
REQUIRED_KEYS = ("format", "format_version", "config", "architecture", "parameters", "n_params", "splits",
                 "counts", "metadata", "shards")


def package_version() -> str:
    try:
        return importlib_metadata.version("small-transformer-zoo")
    except importlib_metadata.PackageNotFoundError:
        return "unknown"


def base_provenance() -> dict[str, Any]:
    """What made this zoo: package and library versions, machine, time."""
    import numpy
    import torch

    return {
        "created_by": f"small-transformer-zoo {package_version()}",
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
    }


def check_manifest(manifest: Any, path: str) -> dict[str, Any]:
    """Check the manifest's format, version and required fields; return it."""
    if not isinstance(manifest, dict):
        raise ZooDamagedError(path, "manifest is not a JSON object")
    if manifest.get("format") != FORMAT_NAME:
        raise ZooDamagedError(path, f"field 'format' is {manifest.get('format')!r}, expected {FORMAT_NAME!r}")
    version = manifest.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise ZooDamagedError(path, f"field 'format_version' is {version!r}; this package reads format version "
                                   f"{FORMAT_VERSION} (upgrade small-transformer-zoo for newer zoos)")
    missing = [key for key in REQUIRED_KEYS if key not in manifest]
    if missing:
        raise ZooDamagedError(path, f"manifest lacks fields {missing}")
    try:
        spec = ArchitectureSpec.from_dict(manifest["architecture"])
    except (TypeError, ValueError) as exc:
        raise ZooDamagedError(path, f"field 'architecture': {exc}") from None
    if spec.n_params != manifest["n_params"]:
        raise ZooDamagedError(path, f"field 'n_params' is {manifest['n_params']}, the architecture has {spec.n_params}")
    layout = [p.to_dict() for p in spec.parameters()]
    if json.dumps(manifest["parameters"]) != json.dumps(layout):  # as text: `true` is not the number 1
        stated = manifest["parameters"] if isinstance(manifest["parameters"], list) else []
        index = next((i for i, (a, b) in enumerate(zip(stated, layout)) if a != b), min(len(stated), len(layout)))
        raise ZooDamagedError(path, f"field 'parameters' differs from the architecture's layout at entry {index} "
                                   f"(expected {layout[index] if index < len(layout) else 'no entry'})")
    _check_split_rule(manifest["splits"], path)
    _check_descriptions(manifest, path)
    _check_files(manifest, path)
    return manifest


def _check_split_rule(rule: Any, path: str) -> None:
    """`splits`: by run id (or by family of runs), a salt, fractions that are numbers summing to 1 (metadata checks
    assign runs with it)."""
    if not isinstance(rule, dict) or rule.get("by") not in ("run_id", "family") or not isinstance(rule.get("salt"), str):
        raise ZooDamagedError(path, f"field 'splits' must be {{'by': 'run_id' or 'family', 'salt': <text>, "
                                   f"'fractions': {{...}}}}, got {_short(rule)}")
    fractions = rule.get("fractions")
    if not isinstance(fractions, dict) or not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                                  for v in fractions.values()):
        raise ZooDamagedError(path, f"field 'splits.fractions' must map split names to numbers, got {_short(fractions)}")
    try:
        check_fractions(fractions)
    except ValueError as exc:
        raise ZooDamagedError(path, f"field 'splits.fractions': {exc}") from None
    varies = rule.get("varies", [])
    if not isinstance(varies, list) or not all(isinstance(v, str) for v in varies):
        raise ZooDamagedError(path, f"field 'splits.varies' must be a list of hyperparameter names, got {_short(varies)}")
    try:
        SplitRule.from_manifest(rule)
    except ValueError as exc:
        raise ZooDamagedError(path, f"field 'splits': {exc}") from None


def _check_descriptions(manifest: dict[str, Any], path: str) -> None:
    """The fields that describe the zoo have their types (readers and the card print them)."""
    config = manifest["config"]
    if not is_config_name(config):
        raise ZooDamagedError(path, f"field 'config' is {_short(config)}, not a plain config name")
    for field, types in (("task", (dict, type(None))), ("provenance", dict), ("grid", (dict, type(None)))):
        if field in manifest and not isinstance(manifest[field], types):
            raise ZooDamagedError(path, f"field {field!r} is {_short(manifest[field])}, not an object")
    for field, expected in (("dtype", "float32"), ("layout", "packed")):
        if manifest.get(field, expected) != expected:
            raise ZooDamagedError(path, f"field {field!r} is {_short(manifest[field])}; this format stores "
                                       f"{expected!r}")
    epochs = manifest.get("checkpoint_epochs")
    if epochs is not None and (not isinstance(epochs, list) or not all(e == "best" or _is_count(e) for e in epochs)):
        raise ZooDamagedError(path, f"field 'checkpoint_epochs' is {_short(epochs)}, not a list of epochs and 'best'")


NEW_CONFIG_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")


def check_new_config_name(name: Any) -> str:
    """The name of a config about to be written: ASCII letters, digits, '.', '_' and '-', starting with a letter or
    digit, at most 96 characters, so that every file system, the Hub and `datasets` take it as it is. A name
    outside the rule is refused before anything is written."""
    if not isinstance(name, str) or not NEW_CONFIG_NAME.fullmatch(name):
        shown = name if not isinstance(name, str) or len(name) <= 40 else f"{name[:37]}... ({len(name)} characters)"
        raise ValueError(f"config name {shown!r}: a new zoo's name is 1 to 96 ASCII letters, digits, '.', '_' or "
                         f"'-', starting with a letter or digit (e.g. 'mnist-mini')")
    return name


def is_config_name(name: Any) -> bool:
    """A plain folder name, as every config is: not empty, no slash, not hidden."""
    return isinstance(name, str) and bool(name) and "/" not in name and not name.startswith(".")


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < MAX_COUNT


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_files(manifest: dict[str, Any], path: str) -> None:
    """Every file entry well-formed and inside the config folder; counts equal to what the entries hold."""
    metadata, shards, extras = manifest["metadata"], manifest["shards"], manifest.get("extras", [])
    if not isinstance(metadata, dict) or not metadata:
        raise ZooDamagedError(path, "field 'metadata' must map split names to files")
    for split, info in metadata.items():
        if split not in SPLIT_NAMES:
            raise ZooDamagedError(path, f"field 'metadata' names split {split!r}; splits are {list(SPLIT_NAMES)}")
        _check_entry(info, f"metadata.{split}", "metadata/", path, rows=True)
    if not isinstance(shards, list) or not isinstance(extras, list):
        raise ZooDamagedError(path, "fields 'shards' and 'extras' must be lists")
    for index, info in enumerate(shards):
        _check_entry(info, f"shards[{index}]", "weights/", path, rows=True)
        if not isinstance(info.get("split"), str) or info["split"] not in metadata:
            raise ZooDamagedError(path, f"field 'shards[{index}].split' is {info.get('split')!r}, not a split of "
                                       f"this zoo")
    for index, info in enumerate(extras):
        _check_entry(info, f"extras[{index}]", "extras/", path, rows=False)
        if not isinstance(info.get("name", ""), str):
            raise ZooDamagedError(path, f"field 'extras[{index}].name' is {info['name']!r}, not a name")
    named = [info["path"] for info in [*metadata.values(), *shards, *extras]]
    twice = sorted({p for p in named if named.count(p) > 1})
    if twice:
        raise ZooDamagedError(path, f"names file {twice[0]!r} more than once; every file of a zoo is listed once")
    counts = manifest["counts"]
    if not isinstance(counts, dict) or not all(_is_count(counts.get(k)) for k in ("checkpoints", "runs")):
        raise ZooDamagedError(path, f"field 'counts' must be an object with counts of checkpoints and runs, got "
                                   f"{_short(counts)}")
    for split, info in metadata.items():
        in_shards = sum(s["rows"] for s in shards if s["split"] == split)
        if not _is_count(counts.get(split)) or counts[split] != info["rows"] or in_shards != info["rows"]:
            raise ZooDamagedError(path, f"split {split!r}: counts says {counts.get(split)!r}, its metadata "
                                       f"{info['rows']} rows, its shards {in_shards} rows; they must agree")
    if counts["checkpoints"] != sum(info["rows"] for info in metadata.values()):
        raise ZooDamagedError(path, f"field 'counts.checkpoints' is {counts['checkpoints']}, the splits' metadata "
                                   f"hold {sum(info['rows'] for info in metadata.values())} rows")


def _check_entry(info: Any, field: str, folder: str, path: str, *, rows: bool) -> None:
    if not isinstance(info, dict):
        raise ZooDamagedError(path, f"field {field!r} must be an object")
    relpath = info.get("path")
    if not isinstance(relpath, str) or not _inside(relpath, folder):
        raise ZooDamagedError(path, f"field '{field}.path' is {relpath!r}: not a plain path under {folder!r} of the "
                                   f"config folder")
    for key in ("bytes", "rows") if rows else ("bytes",):
        value = info.get(key)
        if not _is_count(value):
            raise ZooDamagedError(path, f"field '{field}.{key}' is {value!r}, not a count")
    digest = info.get("sha256")
    if not isinstance(digest, str) or not SHA256.fullmatch(digest):
        raise ZooDamagedError(path, f"field '{field}.sha256' is {digest!r}, not a sha256 hex digest")


def _inside(relpath: str, folder: str) -> bool:
    """A relative POSIX path under `folder`, with no `..`, empty or absolute parts."""
    parts = relpath.split("/")
    return (relpath.startswith(folder) and "\\" not in relpath and "\x00" not in relpath and not relpath.startswith("/")
            and all(part not in ("", ".", "..") for part in parts))


def load_manifest_text(text: str | bytes, path: str) -> dict[str, Any]:
    try:
        manifest = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ZooDamagedError(path, f"manifest is not valid JSON ({type(exc).__name__}: {exc})") from None
    return check_manifest(manifest, path)


def read_manifest_bytes(config_dir: str | os.PathLike[str]) -> bytes:
    """zoo.json's bytes: a regular file (never a FIFO or a device, which would hang or flood the reader)."""
    path = Path(config_dir) / MANIFEST_NAME
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
        raise ZooNotFoundError(path, "no zoo manifest here (is this a zoo config folder?)") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ZooDamagedError(path, "zoo manifest is not a regular file")
        return handle.read()


def load_manifest(config_dir: str | os.PathLike[str]) -> dict[str, Any]:
    return load_manifest_text(read_manifest_bytes(config_dir), str(Path(config_dir) / MANIFEST_NAME))
