"""The Hugging Face cache side of reading a zoo from the Hub: fetching a config's files from one commit, the
stream root pinned to a commit, and removing files that fail their checks from the cache so that the next read
downloads them again."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import quote

from huggingface_hub import HfApi, snapshot_download

from ..errors import ZooDamagedError, ZooFormatError, ZooNotFoundError, hub_errors
from ..format.manifest import MANIFEST_NAME, load_manifest_text
from ..format.splits import SPLIT_NAMES
from ..store.reader import Verify, Zoo
from ..store.snapshot import manifest_files
from .locate import ZooLocation
from .remote import content_matches


class CachedZoo(Zoo):
    """A zoo read from the Hugging Face cache (`open_zoo` of a Hub repo): a file that fails its check is removed
    from the cache with every other damaged file of the config, as `load_dataset` does, so the next open
    downloads them again."""

    def metadata(self, split: str) -> Any:
        with evicting_damaged(self.dir.parent, self.config, "open"):
            return super().metadata(split)

    def split_weights(self, split: str, verify: Verify | None = None) -> Any:
        with evicting_damaged(self.dir.parent, self.config, "open"):
            return super().split_weights(split, verify)

    def extras(self, verify: Verify | None = None) -> Any:
        with evicting_damaged(self.dir.parent, self.config, "open"):
            return super().extras(verify)


def fetch_config(location: ZooLocation, token: Any) -> Path:
    """`download_zoo` of every split of one config, its failures named as fetching that config."""
    with hub_errors(f"fetching config {location.config!r} from the Hub", location.repo_id):
        return download_zoo(location, None, token)


def download_zoo(location: ZooLocation, splits: tuple[str, ...] | None = None, token: Any = None) -> Path:
    """Fetch the config's manifest, then only the files it names for `splits` (and its extras), both from the one
    commit the revision points at; reuse the cache offline. Returns the local root. Every failure is one
    ZooFormatError naming the repo (offline: that the config is not cached)."""
    from huggingface_hub import constants

    config, wanted = location.config, splits or SPLIT_NAMES
    where = f"{location.repo_id}@{location.revision or 'main'}"
    offline = (f"config {config!r} is not in the local cache and the Hub is offline (HF_HUB_OFFLINE): load it once "
               f"while online, or unset HF_HUB_OFFLINE") if constants.HF_HUB_OFFLINE else ""
    with hub_errors(f"fetching config {config!r} from the Hub", where, f"; {offline}" if offline else ""):
        local = Path(snapshot_download(location.repo_id, repo_type="dataset", revision=location.revision,
                                       allow_patterns=[f"{config}/{MANIFEST_NAME}"], token=token))
        manifest_path = local / config / MANIFEST_NAME
        if not manifest_path.is_file():
            raise ZooNotFoundError(where, offline or f"unknown config {config!r}: the repo has no {config}/{MANIFEST_NAME}")
        raw = manifest_path.read_bytes()
        if content_matches(raw, manifest_path.resolve().name) is False:
            evict_from_hub_cache(str(manifest_path), local)
            others = evict_mismatched_blobs(local, config)
            also = f" (and {len(others)} more damaged files of {config!r})" if others else ""
            raise ZooDamagedError(manifest_path, f"does not match its content address (a damaged download); removed "
                                                 f"from the Hugging Face cache{also}, so the next load downloads it "
                                                 f"again")
        files = manifest_files(load_manifest_text(raw, str(manifest_path)), wanted)
        snapshot_download(location.repo_id, repo_type="dataset", revision=local.name,  # the snapshot's commit
                          allow_patterns=[f"{config}/{path}" for path in files], token=token)
        missing = [path for path in files if not (local / config / path).is_file()]
        if missing:
            raise ZooNotFoundError(where, (offline.replace(f"config {config!r}", f"{len(missing)} files of config "
                                                                               f"{config!r}") if offline else
                                         f"{len(missing)} files its manifest names are not in the repo, first "
                                         f"{missing[0]}"))
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


def evict_damaged_files(snapshot: Path, config: str) -> list[str]:
    """Check every file of `config` in a Hub cache snapshot against its manifest entry (size, then sha256) and
    remove each one that fails, so that one retry downloads them all again; returns the relative paths removed."""
    import hashlib

    folder = snapshot / config
    try:
        manifest = load_manifest_text((folder / MANIFEST_NAME).read_bytes(), str(folder / MANIFEST_NAME))
    except (OSError, ZooFormatError):
        return []
    entries = [*manifest["metadata"].values(), *manifest["shards"], *manifest.get("extras", [])]
    removed = []
    for info in entries:
        path = folder / info["path"]
        if not path.is_file():
            continue
        with open(path, "rb") as handle:
            damaged = (os.fstat(handle.fileno()).st_size != info.get("bytes")
                       or hashlib.file_digest(handle, "sha256").hexdigest() != info.get("sha256"))
        if damaged and evict_from_hub_cache(str(path), snapshot):
            removed.append(info["path"])
    return removed


def evict_mismatched_blobs(snapshot: Path, config: str) -> list[str]:
    """Without a manifest to check against (its own download was damaged): remove every cached file of `config`
    whose bytes do not match the content address the Hugging Face cache names its blob by, so that one retry
    downloads them all again; returns the relative paths removed."""
    folder, removed = snapshot / config, []
    for path in sorted(folder.rglob("*")) if folder.is_dir() else ():
        if not path.is_file() or path.name == MANIFEST_NAME:
            continue
        if content_matches(path.read_bytes(), path.resolve().name) is False and \
                evict_from_hub_cache(str(path), snapshot):
            removed.append(path.relative_to(folder).as_posix())
    return removed


@contextmanager
def evicting_damaged(snapshot: Path | None, config: str | None, verb: str) -> Iterator[None]:
    """A ZooFormatError inside the block about a file of the Hub cache snapshot `snapshot` (None: a local zoo,
    nothing to evict) removes that file and every other damaged file of `config` from the cache, and says so: the
    next `verb` downloads them again, all at once."""
    try:
        yield
    except ZooFormatError as exc:
        if snapshot is None or not evict_from_hub_cache(exc.path, snapshot):
            raise
        others = evict_damaged_files(snapshot, config) if config else []
        also = f" (and {len(others)} more damaged files of {config!r})" if others else ""
        raise type(exc)(exc.path, f"{exc.problem}; removed from the Hugging Face cache{also}, so the next "
                                       f"{verb} downloads it again") from None


def streaming_root(location: ZooLocation, token: Any = None) -> str:
    """`hf://` root pinned to the commit the revision points at now, so one stream never mixes two commits."""
    with hub_errors("finding the commit to stream from", f"{location.repo_id}@{location.revision or 'main'}"):
        sha = HfApi().dataset_info(location.repo_id, revision=location.revision, token=token).sha
    return f"hf://datasets/{location.repo_id}@{quote(sha or location.revision or 'main', safe='')}"
