"""`load_dataset`: one entry point for a local root, a Hub repo id, or the short name `small-transformer-zoo`.

The short name means: a zoo built on this machine under that config (found offline through the local registry),
otherwise the default Hub repo (`$STZ_REPO_ID` overrides it). From the Hub, only the files of the asked config
and split are downloaded, and a second call works offline from the Hugging Face cache.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import datasets
from huggingface_hub import HfApi, snapshot_download

from .architecture import ArchitectureSpec
from .builder import builder_for, zoo_features
from .errors import ZooFormatError, hub_errors
from .manifest import MANIFEST_NAME, load_manifest_text
from .reader import Zoo
from .registry import find_local_zoo
from .remote import content_matches
from .root_card import list_configs
from .selection import where_to_json
from .snapshot import manifest_files
from .splits import SPLIT_NAMES
from .verification import check_verify_mode

SHORT_NAME = "small-transformer-zoo"
DEFAULT_REPO_ID = "small-transformer-zoo/small-transformer-zoo"
REPO_ENV = "STZ_REPO_ID"
HUB_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*")


@dataclass(frozen=True)
class ZooLocation:
    """Where a zoo config lives: a local root folder, or a Hub dataset repo at a revision."""

    kind: Literal["local", "hub"]
    root: str
    config: str
    repo_id: str | None = None
    revision: str | None = None


def default_repo_id() -> str:
    return os.environ.get(REPO_ENV) or DEFAULT_REPO_ID


def resolve_zoo(name_or_path: str | os.PathLike[str], config: str | None = None,
                revision: str | None = None) -> ZooLocation:
    """Say where `name_or_path`/`config` is, without downloading anything."""
    text = os.fspath(name_or_path)
    if os.path.isdir(text):
        root = Path(text)
        if (root / MANIFEST_NAME).is_file():
            return ZooLocation("local", str(root.parent), root.name)
        configs = list_configs(root)
        if config is None:
            if len(configs) != 1:
                raise ZooFormatError(root, f"holds configs {configs}; pass config=" if configs else "holds no zoo")
            config = configs[0]
        if config not in configs:
            raise ZooFormatError(root, f"unknown config {config!r}; configs here: {configs}")
        return ZooLocation("local", str(root), config)
    if config is None:
        raise ValueError(f"{text!r}: name a config, e.g. load_dataset({text!r}, 'mnist')")
    if text == SHORT_NAME:
        local = find_local_zoo(config)
        if local is not None and revision is None:
            return ZooLocation("local", str(local), config)
        text = default_repo_id()
    if not HUB_REPO_ID.fullmatch(text):
        raise ZooFormatError(text, "neither a local folder nor a Hub repo id of the form 'owner/name'")
    return ZooLocation("hub", f"hf://datasets/{text}", config, text, revision)


def open_zoos(name_or_path: str | os.PathLike[str], config: str | None = None, revision: str | None = None,
              token: Any = None) -> list[Zoo]:
    """The named config, or every config, of a zoo root given as a local folder (or config folder) or as a Hub
    dataset repo id `owner/name`; from the Hub only those configs' files are fetched (into the Hugging Face cache,
    reused offline). Every problem is a DataError naming what was asked for."""
    text = os.fspath(name_or_path)
    root = Path(text)
    if root.is_dir():
        if (root / MANIFEST_NAME).is_file():
            zoo = Zoo(root)
            if config not in (None, zoo.config):
                raise ZooFormatError(root, f"is the config folder of {zoo.config!r}, not {config!r}")
            return [zoo]
        configs = [config] if config else list_configs(root)
        if not configs:
            raise ZooFormatError(root, "holds no zoo config (no <config>/zoo.json)")
        return [Zoo.open(root, c) for c in configs]
    if root.exists():
        raise ZooFormatError(root, "is a file, not a zoo folder")
    if not HUB_REPO_ID.fullmatch(text):
        raise ZooFormatError(root, "no such folder (and not a Hub repo id of the form 'owner/name')")
    if config is None:
        revision, configs = _hub_configs(text, revision, token)
    else:
        configs = [config]
    return [Zoo.open(_fetch(ZooLocation("hub", f"hf://datasets/{text}", c, text, revision), token), c)
            for c in configs]


def open_zoo(name_or_path: str | os.PathLike[str], config: str | None = None, revision: str | None = None,
             token: Any = None) -> Zoo:
    """One config of a local or Hub zoo root (`open_zoos`); `config` may be left out when the root has one."""
    zoos = open_zoos(name_or_path, config, revision, token)
    if len(zoos) != 1:
        raise ZooFormatError(name_or_path, f"holds configs {[z.config for z in zoos]}; name one with --config")
    return zoos[0]


def as_zoo(zoo: Zoo | str | os.PathLike[str], config: str | None = None) -> Zoo:
    """A Zoo given itself or by root (`open_zoo`), for functions that take either."""
    if isinstance(zoo, Zoo):
        if config not in (None, zoo.config):
            raise ZooFormatError(zoo.dir, f"is config {zoo.config!r}, not {config!r}")
        return zoo
    return open_zoo(zoo, config)


def _hub_configs(repo_id: str, revision: str | None, token: Any) -> tuple[str, list[str]]:
    """The commit `revision` points at now and the configs it holds, so that every config is fetched from it."""
    with hub_errors("no such folder, and reading it as a Hub dataset repo", repo_id):
        api = HfApi()
        commit = api.dataset_info(repo_id, revision=revision, token=token).sha or revision or "main"
        files = api.list_repo_files(repo_id, repo_type="dataset", revision=commit, token=token)
    configs = sorted(f.split("/")[0] for f in files if f.count("/") == 1 and f.endswith(f"/{MANIFEST_NAME}"))
    if not configs:
        raise ZooFormatError(repo_id, "the Hub dataset repo holds no zoo config (no <config>/zoo.json)")
    return commit, configs


def _fetch(location: ZooLocation, token: Any) -> Path:
    with hub_errors(f"fetching config {location.config!r} from the Hub", location.repo_id):
        return download_zoo(location, None, token)


def _check_split(split: str | None) -> tuple[str, ...] | None:
    if split is None:
        return None
    if split not in SPLIT_NAMES:
        raise ZooFormatError(None, f"unknown split {split!r}; zoo splits are {list(SPLIT_NAMES)}")
    return (split,)


def download_zoo(location: ZooLocation, splits: tuple[str, ...] | None = None, token: Any = None) -> Path:
    """Fetch the config's manifest, then only the files it names for `splits` (and its extras), both from the one
    commit the revision points at; reuse the cache offline. Returns the local root."""
    config, wanted = location.config, splits or SPLIT_NAMES
    local = Path(snapshot_download(location.repo_id, repo_type="dataset", revision=location.revision,
                                   allow_patterns=[f"{config}/{MANIFEST_NAME}"], token=token))
    manifest_path = local / config / MANIFEST_NAME
    if not manifest_path.is_file():
        raise ZooFormatError(f"{location.repo_id}@{location.revision or 'main'}",
                             f"unknown config {config!r}: the repo has no {config}/{MANIFEST_NAME}")
    raw = manifest_path.read_bytes()
    if content_matches(raw, manifest_path.resolve().name) is False:
        evict_from_hub_cache(str(manifest_path), local)
        raise ZooFormatError(manifest_path, "does not match its content address (a damaged download); removed "
                                            "from the Hugging Face cache, so the next load downloads it again")
    files = manifest_files(load_manifest_text(raw, str(manifest_path)), wanted)
    snapshot_download(location.repo_id, repo_type="dataset", revision=local.name,  # the snapshot's commit
                      allow_patterns=[f"{config}/{path}" for path in files], token=token)
    return local


def evict_from_hub_cache(path: str | None, snapshot: Path) -> bool:
    """Remove a downloaded file that failed verification from the Hugging Face cache (its snapshot link and its
    blob), so that a bad download is not served again; True when `path` was in the cache."""
    if path is None or not Path(path).is_relative_to(snapshot):
        return False
    link = Path(path)
    blob = link.resolve()
    link.unlink(missing_ok=True)
    blob.unlink(missing_ok=True)
    return True


def streaming_root(location: ZooLocation, token: Any = None) -> str:
    """`hf://` root pinned to the commit the revision points at now, so one stream never mixes two commits."""
    sha = HfApi().dataset_info(location.repo_id, revision=location.revision, token=token).sha
    return f"hf://datasets/{location.repo_id}@{quote(sha or location.revision or 'main', safe='')}"


def _no_rows() -> Iterator[dict[str, Any]]:
    yield from ()


def _prepare(builder: Any, location: ZooLocation, root: Path) -> None:
    """`download_and_prepare`, its errors naming the file; a Hub download that fails its check leaves the cache."""
    try:
        try:
            builder.download_and_prepare()
        except datasets.exceptions.DatasetGenerationError as exc:
            if isinstance(exc.__cause__, ZooFormatError):  # say which file failed, not that generation did
                raise exc.__cause__ from None
            raise
    except ZooFormatError as exc:
        if location.kind == "hub" and evict_from_hub_cache(exc.path, root):
            raise ZooFormatError(exc.path, f"{exc.problem}; removed from the Hugging Face cache, so the next load "
                                           f"downloads it again") from None
        raise


def load_dataset(
    name_or_path: str | os.PathLike[str],
    config: str | None = None,
    split: str | None = None,
    streaming: bool = False,
    revision: str | None = None,
    *,
    cache_dir: str | None = None,
    token: Any = None,
    verify: Literal["once", "always", "never"] = "once",
    where: Mapping[str, Any] | None = None,
) -> datasets.Dataset | datasets.DatasetDict | datasets.IterableDataset | datasets.IterableDatasetDict:
    """Load a zoo config as a `datasets` object: one row per checkpoint, packed weights in `params`.

    `name_or_path`: a local zoo root (or config folder), a Hub repo id, or `"small-transformer-zoo"`.
    `split=None` gives all splits as a DatasetDict. `streaming=True` reads rows lazily (local or Hub).
    `verify`: sha256 checks of weight shards before use ("once" per file per machine, "always", "never").
    `where`: only the checkpoints whose metadata match, e.g. `{"optimizer": "adam", "learning_rate": (1e-4, 1e-3),
    "epoch": [1, 50]}` (`small_transformer_zoo.selection`); the filter runs before any weight is read.
    """
    check_verify_mode(verify)
    splits = _check_split(split)
    location = resolve_zoo(name_or_path, config, revision)
    if location.kind == "hub":
        root = streaming_root(location, token) if streaming else str(download_zoo(location, splits, token))
    else:
        root = str(Path(location.root).resolve())  # `datasets` reads relative paths against the root again
    builder = builder_for(root, location.config, splits=splits, verify=verify, cache_dir=cache_dir, token=token,
                          where=where_to_json(where))
    manifest, wanted = builder.manifest, builder.wanted_splits
    filled = tuple(s for s in wanted if manifest["counts"][s] > 0)
    out: dict[str, Any] = {}
    if streaming:
        out = {name: data for name, data in builder.as_streaming_dataset().items() if name in filled}
    elif filled:
        _prepare(builder, location, Path(root))
        prepared = builder.info.splits
        out = {name: builder.as_dataset(split=name) for name in filled if prepared[name].num_examples > 0}
    # `datasets` cannot read a split without rows back; an empty split (or selection) is still a split of the zoo.
    features = zoo_features(ArchitectureSpec.from_dict(manifest["architecture"]))
    for name in wanted:
        if name not in out:
            if streaming:
                out[name] = datasets.IterableDataset.from_generator(_no_rows, features=features)
            else:
                out[name] = datasets.Dataset.from_dict({k: [] for k in features}, features=features, split=name)
    if split is not None:
        return out[split]
    ordered = {name: out[name] for name in wanted}
    return datasets.IterableDatasetDict(ordered) if streaming else datasets.DatasetDict(ordered)
