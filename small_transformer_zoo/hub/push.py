"""`stz push`: upload a verified zoo root, dataset card included, to a Hub dataset repo.

Nothing is uploaded unless every config passes `Zoo.verify()`. Exactly the files the manifests name are uploaded,
and the same commit deletes the data files of the repo's configs that the manifests no longer name (an earlier
version's), so the repo holds what the local root holds. The upload only reads the local files, so an
interrupted push leaves the zoo as it was; run again, it re-sends only what the Hub does not have yet (the Hub
answers the LFS batch call without upload actions for objects it already stores).
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from ..errors import ZooDamagedError, ZooNotFoundError, hub_errors
from ..store.files import exclusive_lock
from ..format.manifest import MANIFEST_NAME
from ..store.reader import Zoo
from ..store.card import write_root_card
from ..store.configs import list_configs
from ..store.snapshot import manifest_files
from ..store.writer import DATA_FOLDERS


def push_zoo(root: str | os.PathLike[str], repo_id: str, *, token: Any = None, private: bool = False,
             revision: str | None = None, commit_message: str | None = None) -> str:
    """Verify, refresh the card, create the repo if needed and upload; returns the commit sha."""
    root = Path(root)
    configs = list_configs(root)
    if not configs:
        raise ZooNotFoundError(root, "holds no zoo config (no <config>/zoo.json); nothing to push")
    with ExitStack() as locks:  # no build or import may replace a config while its files are uploaded
        for config in configs:
            locks.enter_context(exclusive_lock(root, config, f"stz push to {repo_id}"))
        return _push_locked(root, configs, repo_id, token, private, revision, commit_message)


def _push_locked(root: Path, configs: list[str], repo_id: str, token: Any, private: bool, revision: str | None,
                 commit_message: str | None) -> str:
    from huggingface_hub import HfApi

    zoos = [Zoo.open(root, config) for config in configs]
    problems = [p for zoo in zoos for p in zoo.verify()]
    if problems:
        raise ZooDamagedError(root, f"refusing to push: `stz verify` finds {len(problems)} problems, first: "
                                   f"{problems[0]}")
    write_root_card(root, repo_id)
    api = HfApi(token=token)
    # No network, refused, or the Hub said no: the local zoo is untouched either way.
    with hub_errors(f"push to dataset {repo_id}", then="; the local zoo is unchanged, run the push again"):
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        info = api.upload_folder(repo_id=repo_id, repo_type="dataset", folder_path=root, revision=revision,
                                 allow_patterns=["README.md", *(f"{zoo.config}/{path}" for zoo in zoos for path in
                                                                [MANIFEST_NAME, *manifest_files(zoo.manifest)])],
                                 delete_patterns=[f"{config}/{folder}/*" for config in configs
                                                  for folder in DATA_FOLDERS],
                                 commit_message=commit_message or f"Upload zoo configs {', '.join(configs)}")
    return info.oid
