"""Where a zoo named by the user lives: a local root folder (or config folder), a Hub dataset repo id, or the short
name `small-transformer-zoo` (a zoo registered on this machine under that config, else the default Hub repo).
Nothing is downloaded here."""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import ZooArgumentError, ZooFormatError, ZooNotFoundError
from ..format.manifest import MANIFEST_NAME
from ..store.configs import choose_config, list_configs
from ..store.local_index import SHORT_NAME, default_repo_id, find_local_zoo, registered_configs

HUB_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


@dataclass(frozen=True)
class ZooLocation:
    """Where a zoo config lives: a local root folder, or a Hub dataset repo at a revision. `config` is None only
    where the caller may take every config of the root."""

    kind: Literal["local", "hub"]
    root: str
    config: str | None
    repo_id: str | None = None
    revision: str | None = None
    hint: str = ""  # for the short name read from the Hub: the configs registered here, and the closest one

    @contextmanager
    def hinting(self) -> Iterator[None]:
        """A failure to read the zoo inside the block also says what `hint` says."""
        try:
            yield
        except ZooFormatError as exc:
            if not self.hint:
                raise
            raise type(exc)(exc.path, f"{exc.problem}; {self.hint}") from None


def locate(name_or_path: str | os.PathLike[str], config: str | None = None,
           revision: str | None = None) -> ZooLocation:
    """The one rule for naming a zoo, in every function and command: an existing folder is a local root (or a
    config folder); the short name is a config registered on this machine (`stz register`), else the default Hub
    repo's; anything else must be a Hub repo id `owner/name`. A local `config` is checked here; the configs of a
    Hub repo are not listed (nothing is downloaded)."""
    text = os.fspath(name_or_path)
    path = Path(text)
    if path.is_dir():
        if (path / MANIFEST_NAME).is_file():
            if config not in (None, path.name):
                raise ZooArgumentError(path, f"is the config folder of {path.name!r}, not of {config!r}")
            return ZooLocation("local", str(path.parent), path.name)
        configs = list_configs(path)
        return ZooLocation("local", text, None if config is None and len(configs) > 1 else
                           choose_config(configs, config, path))
    if path.exists():
        raise ZooArgumentError(path, "is a file, not a zoo folder")
    if text == SHORT_NAME:
        if config is None:
            raise ZooArgumentError(text, "the short name stands for one config: choose it with argument `config`")
        local = find_local_zoo(config) if revision is None else None
        if local is not None:
            return ZooLocation("local", str(local), config)
        repo_id = default_repo_id()
        close = [c for c in registered_configs() if one_typo_apart(config, c)]
        if close and revision is None:
            raise ZooNotFoundError(text, f"did you mean {close[0]!r}? Config {config!r} is not registered on this "
                                         f"machine and {close[0]!r} is; to read {config!r} from the Hub, name the "
                                         f"repo ({repo_id!r}) instead of the short name")
        return ZooLocation("hub", f"hf://datasets/{repo_id}", config, repo_id, revision,
                           _registered_hint(config, repo_id))
    if not HUB_REPO_ID.fullmatch(text):
        raise ZooNotFoundError(text, "no such folder, and not a Hub dataset repo id of the form 'owner/name'")
    return ZooLocation("hub", f"hf://datasets/{text}", config, text, revision)


def one_typo_apart(a: str, b: str) -> bool:
    """Whether `b` is `a` with one typo: a character added, dropped, replaced, or two neighbours swapped."""
    if a == b or abs(len(a) - len(b)) > 1:
        return False
    if len(a) == len(b):
        differ = [i for i in range(len(a)) if a[i] != b[i]]
        return len(differ) == 1 or (len(differ) == 2 and differ[1] == differ[0] + 1
                                    and a[differ[0]] == b[differ[1]] and a[differ[1]] == b[differ[0]])
    short, long = sorted((a, b), key=len)
    return any(long[:i] + long[i + 1:] == short for i in range(len(long)))


def _registered_hint(config: str, repo_id: str) -> str:
    """What the short name would have found here: the configs registered on this machine and the closest to
    `config`, for an error about reading `config` from the Hub repo `repo_id` instead."""
    registered = registered_configs()
    if not registered:
        return (f"config {config!r} is not registered on this machine (none is: `stz build` and `stz register` "
                f"register zoos), so the short name read it from the Hub repo {repo_id!r}")
    close = difflib.get_close_matches(config, registered, n=1)
    suggestion = f"; did you mean {close[0]!r}?" if close else ""
    return (f"config {config!r} is not registered on this machine (registered: {registered}), so the short name "
            f"read it from the Hub repo {repo_id!r}{suggestion}")


def resolve_zoo(name_or_path: str | os.PathLike[str], config: str | None = None,
                revision: str | None = None) -> ZooLocation:
    """Where one config of a zoo is (`locate`), without downloading anything: `config` may be left out only when a
    local root holds one config."""
    location = locate(name_or_path, config, revision)
    if location.config is None:
        where = location.repo_id or location.root
        if location.kind == "hub":
            raise ZooArgumentError(where, "choose a config with argument `config` (`stz info` lists a Hub repo's "
                                          "configs)")
        choose_config(list_configs(location.root), None, where)
    return location
