"""The zoos the short name stands for on this machine, by config name, so `load_dataset("small-transformer-zoo",
cfg)` finds them offline: every build and import registers its zoo (the latest one of a config name wins, and says
so), and `stz register ROOT` registers a zoo that was copied or moved here."""

from __future__ import annotations

import json
import os
from pathlib import Path

from .files import atomic_write_json, shared_file_update, stz_home
from ..format.manifest import MANIFEST_NAME


SHORT_NAME = "small-transformer-zoo"
DEFAULT_REPO_ID = "small-transformer-zoo/small-transformer-zoo"
REPO_ENV = "STZ_REPO_ID"


def default_repo_id() -> str:
    """The Hub repo the short name stands for where no zoo of a config is registered here ($STZ_REPO_ID)."""
    return os.environ.get(REPO_ENV) or DEFAULT_REPO_ID


def _registry_path() -> Path:
    return stz_home() / "registry.json"


def _read() -> dict[str, str]:
    try:
        data = json.loads(_registry_path().read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def register_local_zoo(config: str, root: str | os.PathLike[str]) -> Path | None:
    """Let the short name's `config` mean the zoo under `root`; returns the root it meant before (None: none, or
    the same)."""
    with shared_file_update(_registry_path(), f"registering {config}"):
        entries = _read()
        before = entries.get(config)
        entries[config] = str(Path(root).resolve())
        atomic_write_json(_registry_path(), entries)
    return None if before in (None, entries[config]) else Path(before)


def registered_configs() -> list[str]:
    """The configs registered on this machine whose zoo still exists, sorted."""
    return sorted(config for config in _read() if find_local_zoo(config) is not None)


def find_local_zoo(config: str) -> Path | None:
    """The root of a zoo config built here, if it still exists."""
    root = _read().get(config)
    if root and (Path(root) / config / MANIFEST_NAME).is_file():
        return Path(root)
    return None
