"""Opening a zoo by name: a local folder or config folder, a Hub dataset repo id, or the short name, as a `Zoo`
whose reads memory-map local files. From the Hub only the asked configs' files are fetched, into the Hugging Face
cache, and reused offline. `open_zoo` is the front door (it also takes a `Zoo`, for functions that accept either);
`load_dataset` (`hub.load`) reads a zoo as a `datasets` object instead."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from huggingface_hub import HfApi

from ..errors import ZooArgumentError, ZooNotFoundError, hub_errors
from ..format.manifest import MANIFEST_NAME
from ..store.configs import choose_config, list_configs
from ..store.reader import Verify, Zoo
from .download import CachedZoo, fetch_config
from .locate import locate


def _open_configs(name_or_path: str | os.PathLike[str], config: str | None = None, revision: str | None = None,
                  token: Any = None, verify: Verify = "once") -> list[Zoo]:
    """The named config, or every config, of a zoo named as `locate` says (a local folder or config folder, a Hub
    dataset repo id, or the short name); from the Hub only those configs' files are fetched (into the Hugging Face
    cache, reused offline). `verify` is each `Zoo`'s default for its reads. Every problem is a DataError naming
    what was asked for."""
    location = locate(name_or_path, config, revision)
    if location.kind == "local":
        configs = [location.config] if location.config else list_configs(location.root)
        return [Zoo.open(location.root, c, verify=verify) for c in configs]
    if location.config is None:
        commit, configs = _hub_configs(location.repo_id, revision, token)
        location = replace(location, revision=commit)
    else:
        configs = [location.config]
    with location.hinting():
        return [CachedZoo.open(fetch_config(replace(location, config=c), token), c, verify=verify) for c in configs]


def open_zoo(zoo: Zoo | str | os.PathLike[str], config: str | None = None, revision: str | None = None,
             token: Any = None, verify: Verify = "once") -> Zoo:
    """One config of a zoo named as `locate` says; `config` may be left out when the root has one. A `Zoo` given
    itself is returned as it is, once its config is checked against `config`."""
    if isinstance(zoo, Zoo):
        if config not in (None, zoo.config):
            raise ZooArgumentError(zoo.dir, f"is config {zoo.config!r}, not {config!r}")
        return zoo
    zoos = _open_configs(zoo, config, revision, token, verify)
    if len(zoos) != 1:
        choose_config([z.config for z in zoos], None, zoo)
    return zoos[0]


def _hub_configs(repo_id: str, revision: str | None, token: Any) -> tuple[str, list[str]]:
    """The commit `revision` points at now and the configs it holds, so that every config is fetched from it."""
    with hub_errors("no such folder, and reading it as a Hub dataset repo", repo_id):
        api = HfApi()
        commit = api.dataset_info(repo_id, revision=revision, token=token).sha or revision or "main"
        files = api.list_repo_files(repo_id, repo_type="dataset", revision=commit, token=token)
    configs = sorted(f.split("/")[0] for f in files if f.count("/") == 1 and f.endswith(f"/{MANIFEST_NAME}"))
    if not configs:
        raise ZooNotFoundError(repo_id, "the Hub dataset repo holds no zoo config (no <config>/zoo.json)")
    return commit, configs
