"""The zoos the short name stands for on this machine, by config name, so `load_dataset("small-transformer-zoo",
cfg)` finds them offline.

Every build and import registers its zoo's root under its config name, beside any root registered before; `stz
register ROOT` registers a zoo that was copied or moved here and makes it the one the name means. The short name
never picks silently: where two registered roots still hold zoos of one config that differ, it is an error that
lists both and says how to choose. A registry that cannot be read is an error naming it, never reset.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .files import atomic_write_json, check_stz_home, read_small_file, shared_file_update, stz_home
from ..errors import ZooArgumentError, ZooDamagedError
from ..format.manifest import MANIFEST_NAME


SHORT_NAME = "small-transformer-zoo"
DEFAULT_REPO_ID = "small-transformer-zoo/small-transformer-zoo"
REPO_ENV = "STZ_REPO_ID"
REGISTRY_LIMIT = 16 << 20


def default_repo_id() -> str:
    """The Hub repo the short name stands for where no zoo of a config is registered here ($STZ_REPO_ID)."""
    return os.environ.get(REPO_ENV) or DEFAULT_REPO_ID


def registry_path() -> Path:
    return stz_home() / "registry.json"


def _read() -> dict[str, list[str]]:
    """config -> the roots registered for it, oldest first (a registry written before several roots were kept maps
    a config to one root). A file that is not a registry is a `ZooDamagedError` naming it."""
    check_stz_home()
    path = registry_path()
    raw = read_small_file(path, "the registry of local zoos", REGISTRY_LIMIT)
    if raw is None:
        return {}
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise _damaged(path, f"is not JSON ({exc.__class__.__name__}: {str(exc)[:80]})") from None
    if not isinstance(data, dict):
        raise _damaged(path, f"holds a JSON {type(data).__name__}, not an object of config -> roots")
    entries = {}
    for config, roots in data.items():
        roots = [roots] if isinstance(roots, str) else roots
        if not isinstance(roots, list) or not all(isinstance(r, str) for r in roots):
            raise _damaged(path, f"entry {config!r} is {roots!r}, not a list of zoo roots")
        entries[str(config)] = roots
    return entries


def _damaged(path: Path, problem: str) -> ZooDamagedError:
    return ZooDamagedError(path, f"{problem}: the registry of local zoos is damaged and was left as it is; remove "
                                 f"it, then `stz register ROOT` registers each zoo again (builds register theirs)")


def register_local_zoo(config: str, root: str | os.PathLike[str], choose: bool = False) -> list[Path]:
    """Let the short name's `config` mean the zoo under `root`: beside the roots registered before, or, with
    `choose` (`stz register`), instead of them. Returns the other roots that still hold a zoo of `config`."""
    root = str(Path(root).resolve())
    with shared_file_update(registry_path(), f"registering {config}"):
        entries = _read()
        others = [r for r in entries.get(config, []) if r != root]
        entries[config] = [root] if choose else [*others, root]
        atomic_write_json(registry_path(), entries)
    return [Path(r) for r in others if (Path(r) / config / MANIFEST_NAME).is_file()]


def registered_configs() -> list[str]:
    """The configs registered on this machine whose zoo still exists, sorted."""
    return sorted(config for config, roots in _read().items()
                  if any((Path(r) / config / MANIFEST_NAME).is_file() for r in roots))


def find_local_zoo(config: str) -> Path | None:
    """The root of the zoo config the short name means here, if one still exists. Several registered roots that
    hold the same zoo (the same files) are one; roots that hold different zoos are a `ZooArgumentError` listing
    them."""
    roots = [Path(r) for r in _read().get(config, []) if (Path(r) / config / MANIFEST_NAME).is_file()]
    if not roots:
        return None
    contents = {root: _content(root / config / MANIFEST_NAME) for root in roots}
    if len(set(contents.values())) > 1:
        listed = ", ".join(str(root / config) for root in roots)
        raise ZooArgumentError(SHORT_NAME, f"config {config!r} is registered for {len(roots)} different zoos on this "
                                           f"machine ({listed}); name the one you mean by its path, or make it the "
                                           f"one the short name means with `stz register ROOT --config {config}`")
    return roots[-1]


def _content(manifest_path: Path) -> Any:
    """What makes a zoo the zoo it is: the hashes of its data files (two copies of a zoo have the same)."""
    try:
        manifest = json.loads(manifest_path.read_text())
        return (tuple(sorted(s["sha256"] for s in manifest["shards"])),
                tuple(sorted(m["sha256"] for m in manifest["metadata"].values())))
    except (OSError, ValueError, KeyError, TypeError):
        return ("unreadable", str(manifest_path))
