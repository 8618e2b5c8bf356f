"""`stz push`: upload a verified zoo root, dataset card included, to a Hub dataset repo.

Nothing is uploaded unless every config passes `Zoo.verify()`. The upload only reads the local files, so an
interrupted push leaves the zoo as it was; run again, it re-sends only what the Hub does not have yet (the Hub
answers the LFS batch call without upload actions for objects it already stores).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .errors import ZooFormatError, hub_errors
from .reader import Zoo
from .root_card import list_configs, write_root_card

IGNORE = [".*", "*/.*", "*/.build/**", "*/.staging/**", "plots/**", "bench/**"]


def push_zoo(root: str | os.PathLike[str], repo_id: str, *, token: Any = None, private: bool = False,
             revision: str | None = None, commit_message: str | None = None) -> str:
    """Verify, refresh the card, create the repo if needed and upload; returns the commit sha."""
    from huggingface_hub import HfApi

    root = Path(root)
    configs = list_configs(root)
    if not configs:
        raise ZooFormatError(root, "holds no zoo config (no <config>/zoo.json); nothing to push")
    problems = [p for config in configs for p in Zoo.open(root, config).verify()]
    if problems:
        raise ZooFormatError(root, f"refusing to push: `stz verify` finds {len(problems)} problems, first: "
                                   f"{problems[0]}")
    write_root_card(root)
    api = HfApi(token=token)
    # No network, refused, or the Hub said no: the local zoo is untouched either way.
    with hub_errors(f"push to dataset {repo_id}", then="; the local zoo is unchanged, run the push again"):
        api.create_repo(repo_id, repo_type="dataset", private=private, exist_ok=True)
        info = api.upload_folder(repo_id=repo_id, repo_type="dataset", folder_path=root, revision=revision,
                                 ignore_patterns=IGNORE,
                                 commit_message=commit_message or f"Upload zoo configs {', '.join(configs)}")
    return info.oid
