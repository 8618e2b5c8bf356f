"""The configs of a zoo root and the one rule for choosing among them (local folders and Hub repos alike)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from ..errors import ZooArgumentError, ZooNotFoundError
from ..format.manifest import MANIFEST_NAME


def list_configs(root: str | os.PathLike[str]) -> list[str]:
    """Config folders under a local zoo root (those with a zoo.json)."""
    return sorted(p.parent.name for p in Path(root).glob(f"*/{MANIFEST_NAME}"))


def choose_config(configs: Sequence[str], config: str | None, where: object) -> str:
    """`config` if the root holds it; with `config=None`, the root's only config. `where` names the root in the
    error, which names the argument to pass (the command line shows it as its flag)."""
    if config is None:
        if len(configs) == 1:
            return configs[0]
        if not configs:
            raise ZooNotFoundError(where, f"holds no zoo config (no <config>/{MANIFEST_NAME})")
        raise ZooArgumentError(where, f"holds configs {list(configs)}; choose one with argument `config`")
    if config not in configs:
        raise ZooNotFoundError(where, f"has no config {config!r}; its configs are {list(configs)}")
    return config
