"""Where the authors' release lies: an unpacked folder, one of its `.zip` files, or that `.zip` on the Hub.

Each release zip unpacks to a top folder (`MNIST-Transformers/`, `AG-News-Transformers/`) holding
`metadata/<dataset>.csv` and `<dataset>/`, the folder of `.pt` checkpoints (and, for text, `embedding.pt`). A
`Release` finds that pair whether the source has the top folder or not, and reads members as bytes: a zip is read
member by member, never extracted to disk.
"""

from __future__ import annotations

import os
import re
import stat
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

from ..errors import ZooArgumentError, ZooDamagedError, ZooHubError, ZooNotFoundError

HUB_ADDRESSES = ("hf://", "https://huggingface.co/")
# Dataset names of the release (the CSV's stem) and the task names this package uses for them.
TASK_OF_DATASET = {"mnist": "mnist", "ag_news": "agnews"}
EMBEDDING_FILE = "embedding.pt"
# Bounds on what one member may hold, declared and read: a checkpoint of the release's architecture is about 80 KB,
# its CSV a few MB, AG News's word table some hundred MB.
CHECKPOINT_LIMIT = 16 << 20
TABLE_LIMIT = 2 << 30
READ_CHUNK = 1 << 20
_CSV = re.compile(r"^(?P<top>(?:[^/]+/){0,2})metadata/(?P<dataset>[^/]+)\.csv$")


class Release:
    """One dataset of the release: its CSV, its checkpoint files by name, and the bytes of any member."""

    def __init__(self, source: str, members: list[str], reader: "_Reader", task: str | None) -> None:
        self.source = source
        self._reader = reader
        found = [m for m in (_CSV.match(name) for name in members) if m]
        if task is not None:
            found = [m for m in found if TASK_OF_DATASET.get(m["dataset"], m["dataset"]) == task]
        if not found:
            wanted = f" for task {task!r}" if task else ""
            raise ZooNotFoundError(source, f"no metadata/<dataset>.csv{wanted} at its top or one or two folders down: "
                                         f"not the authors' release layout")
        if len(found) > 1:
            tasks = sorted(TASK_OF_DATASET.get(m["dataset"], m["dataset"]) for m in found)
            raise ZooArgumentError(source, f"holds several releases (tasks {tasks}); choose one with --task")
        match = found[0]
        self.dataset = match["dataset"]
        self.task = TASK_OF_DATASET.get(self.dataset, self.dataset)
        self.csv_member = match.group(0)
        folder = f"{match['top']}{self.dataset}/"
        self.folder = folder
        self.checkpoints: dict[str, str] = {}
        self.embedding_member: str | None = None
        for name in members:
            if not name.startswith(folder) or not name.endswith(".pt"):
                continue
            base = PurePosixPath(name).name
            if base == EMBEDDING_FILE:
                self.embedding_member = name
            elif base in self.checkpoints:
                raise ZooDamagedError(source, f"two checkpoint files named {base!r}: {self.checkpoints[base]} and "
                                             f"{name}")
            else:
                self.checkpoints[base] = name

    @property
    def reader(self) -> "_Reader":
        return self._reader

    @property
    def location(self) -> Path:
        """The local folder or zip the members are read from (a Hub zip once downloaded)."""
        return self._reader.location

    def where(self, member: str) -> str:
        """A member's name for messages: the path inside a folder, or `zip!member`."""
        return self._reader.where(member)

    def read(self, member: str, limit: int = CHECKPOINT_LIMIT) -> bytes:
        return read_member(self._reader, member, limit)

    def close(self) -> None:
        self._reader.close()

    def __enter__(self) -> "Release":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class _Reader:
    location: Path

    def members(self) -> list[str]:
        raise NotImplementedError

    def where(self, member: str) -> str:
        raise NotImplementedError

    def identity(self, member: str) -> str:
        """What identifies this version of a member (its size and time, or the zip's CRC): a part converted from
        it is kept on a rerun only while its sources are unchanged."""
        raise NotImplementedError

    def read(self, member: str, limit: int) -> bytes:
        """A member's bytes; more than `limit` is an error (declared or read)."""
        raise NotImplementedError

    def close(self) -> None:
        """Nothing to release by default."""


class _FolderReader(_Reader):
    def __init__(self, root: Path) -> None:
        self.root = self.location = root

    def members(self) -> list[str]:
        return sorted(p.relative_to(self.root).as_posix() for p in self.root.rglob("*") if p.is_file())

    def where(self, member: str) -> str:
        return str(self.root / member)

    def identity(self, member: str) -> str:
        st = os.stat(self.root / member)
        return f"{st.st_size}:{st.st_mtime_ns}:{st.st_ctime_ns}:{st.st_ino}"

    def read(self, member: str, limit: int) -> bytes:
        path = self.root / member
        if not path.resolve().is_relative_to(self.root.resolve()):
            raise ZooDamagedError(path, f"is a link to {path.resolve()}, outside the release folder; copy the file "
                                       f"into the release")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ZooDamagedError(path, "is not a regular file")
            return _bounded(handle, limit, self.where(member))


class _ZipReader(_Reader):
    def __init__(self, path: Path) -> None:
        self.path = self.location = path
        try:
            self.zip = zipfile.ZipFile(path)
        except (zipfile.BadZipFile, OSError) as exc:
            raise ZooDamagedError(path, f"not a readable zip file ({exc})") from None

    def members(self) -> list[str]:
        return sorted(info.filename for info in self.zip.infolist() if not info.is_dir())

    def where(self, member: str) -> str:
        return f"{self.path}!{member}"

    def identity(self, member: str) -> str:
        info = self.zip.getinfo(member)
        return f"{info.CRC:08x}:{info.file_size}:{info.compress_size}"

    def read(self, member: str, limit: int) -> bytes:
        declared = self.zip.getinfo(member).file_size
        if declared > limit:
            raise ZooDamagedError(self.where(member), f"declares {declared:,} bytes, more than the {limit:,} a member "
                                                     f"of the release may have")
        with self.zip.open(member) as handle:
            return _bounded(handle, limit, self.where(member))

    def close(self) -> None:
        self.zip.close()


def open_reader(location: Path) -> _Reader:
    """A reader of a local release folder or zip, without listing its members."""
    return _FolderReader(location) if location.is_dir() else _ZipReader(location)


def _bounded(handle: Any, limit: int, where: str) -> bytes:
    """All of `handle`, read in chunks, refused as soon as it passes `limit` bytes (whatever it declared)."""
    chunks, total = [], 0
    while chunk := handle.read(READ_CHUNK):
        total += len(chunk)
        if total > limit:
            raise ZooDamagedError(where, f"holds more than the {limit:,} bytes a member of the release may have")
        chunks.append(chunk)
    return b"".join(chunks)


def read_member(reader: _Reader, member: str, limit: int = CHECKPOINT_LIMIT) -> bytes:
    """One member's bytes, within `limit`; a member that cannot be read is an error naming it."""
    try:
        return reader.read(member, limit)
    except (OSError, KeyError, zipfile.BadZipFile) as exc:
        raise ZooDamagedError(reader.where(member), f"cannot be read ({exc})") from None


def hub_zip(address: str) -> Path:
    """A release zip on the Hub (`hf://datasets/<owner>/<name>[@revision]/<file>.zip`, or its web URL) downloaded
    through huggingface_hub, with its cache and progress bar: a second call reads the cache."""
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HfHubHTTPError, HfUriError, LocalEntryNotFoundError
    from huggingface_hub.utils import parse_hf_uri

    try:
        uri = parse_hf_uri(address)
    except HfUriError as exc:
        raise ZooArgumentError(address, f"not a Hub address ({exc})") from None
    if uri.type != "dataset" or not uri.path_in_repo.endswith(".zip"):
        raise ZooArgumentError(address, "a Hub release is a zip in a dataset repo: hf://datasets/<owner>/<name>/<file>.zip"
                                      ", e.g. hf://datasets/anonymized-acamedia/Small-Transformer-Zoo/"
                                      "MNIST-Transformers.zip")
    try:
        return Path(hf_hub_download(uri.id, uri.path_in_repo, repo_type="dataset", revision=uri.revision))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError) as exc:
        first_line = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise ZooHubError(address, f"cannot download it from the Hub ({first_line})") from None


def open_release(source: str | os.PathLike[str], task: str | None = None) -> Release:
    """The release at `source` (folder, `.zip`, or `hf://datasets/.../<file>.zip`); `task` picks one of several."""
    text = os.fspath(source)
    if text.startswith(HUB_ADDRESSES):
        reader = open_reader(hub_zip(text))
    else:
        path = Path(text)
        if not path.exists():
            raise ZooNotFoundError(path, "no such folder or zip file")
        reader = open_reader(path)
    try:
        return Release(text, reader.members(), reader, task)
    except BaseException:
        reader.close()
        raise
