"""Zoos built on this machine, by config name, so `load_dataset("small-transformer-zoo", cfg)` finds them offline."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .files import atomic_write_json, stz_home
from ..format.manifest import MANIFEST_NAME


def _registry_path() -> Path:
    return stz_home() / "registry.json"


def _read() -> dict[str, str]:
    try:
        data = json.loads(_registry_path().read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def register_local_zoo(config: str, root: str | os.PathLike[str]) -> None:
    """Remember that `config` was built under `root` (the last build of a name wins)."""
    entries = _read()
    entries[config] = str(Path(root).resolve())
    atomic_write_json(_registry_path(), entries)


def find_local_zoo(config: str) -> Path | None:
    """The root of a zoo config built here, if it still exists."""
    root = _read().get(config)
    if root and (Path(root) / config / MANIFEST_NAME).is_file():
        return Path(root)
    return None
