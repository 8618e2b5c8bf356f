"""One version of a local zoo config, pinned: zoo.json and every file it names, opened together.

Writers name each data file after its content and rename zoo.json into place last (`writer`), so a file that a
manifest names holds that version's bytes, or is gone because a newer version replaced it. A reader that opens
every file right after reading the manifest, and reads the manifest again whenever one is gone, gets one version
whole; from then on the open files keep that version readable, whatever happens to their paths, until the reader
closes them. A replace is therefore atomic for every `Zoo`, however long it lives.
"""

from __future__ import annotations

import io
import os
import stat
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import ZooDamagedError, ZooFormatError, ZooNotFoundError, ZooReplacedError
from ..format.manifest import MANIFEST_NAME, load_manifest_text

OPEN_ATTEMPTS = 5
MANIFEST_LIMIT = 64 << 20  # bytes of a zoo.json (a zoo of millions of checkpoints has a few MB)


class PinnedFile(io.RawIOBase):
    """A read-only file over a shared descriptor with a position of its own (`os.pread`), so that readers sharing
    the descriptor, threads or forked workers, never move each other's position. Closing it keeps the descriptor."""

    def __init__(self, fd: int, name: str) -> None:
        super().__init__()
        self._fd, self.name, self._position = fd, name, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def readinto(self, buffer: Any) -> int:
        count = os.preadv(self._fd, [buffer], self._position)
        self._position += count
        return count

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position, io.SEEK_END: os.fstat(self._fd).st_size}[whence]
        if base + offset < 0:
            raise ValueError(f"{self.name}: negative seek position {base + offset}")
        self._position = base + offset
        return self._position

    def tell(self) -> int:
        return self._position


def manifest_files(manifest: dict[str, Any], splits: Iterable[str] | None = None) -> list[str]:
    """The data files a manifest names (relative paths): the metadata and shards of `splits` (all when None),
    and the extras."""
    wanted = set(manifest["metadata"] if splits is None else splits)
    entries = [info for split, info in manifest["metadata"].items() if split in wanted]
    entries += [info for info in manifest["shards"] if info["split"] in wanted]
    entries += manifest.get("extras", [])
    return list(dict.fromkeys(info["path"] for info in entries))


class ZooSnapshot:
    """The manifest of one version of `<config_dir>` and its files, held open (`open_snapshot`). Pickled, it
    carries the manifest's bytes and opens the same version's files again where it is unpickled."""

    def __init__(self, config_dir: Path, raw: bytes) -> None:
        self.dir, self.raw = config_dir, raw
        self.manifest = load_manifest_text(raw, str(config_dir / MANIFEST_NAME))
        # relative path -> open descriptor, or why it could not be opened
        base = link_base(config_dir)
        self._files = {relpath: _open_regular(config_dir / relpath, base)
                       for relpath in manifest_files(self.manifest)}
        self._closer = weakref.finalize(self, _close_descriptors, self._files)

    @property
    def complete(self) -> bool:
        return all(isinstance(entry, int) for entry in self._files.values())

    def open(self, relpath: str, what: str) -> PinnedFile:
        """The pinned file at `relpath` (one the manifest names); a clear error if it was missing or not a file."""
        entry = self._files[relpath]
        if isinstance(entry, str):
            kind = ZooNotFoundError if entry == "is missing" else ZooDamagedError
            raise kind(self.dir / relpath, f"{what} {entry}")
        return PinnedFile(entry, str(self.dir / relpath))

    def close(self) -> None:
        self._closer()

    def __reduce__(self) -> tuple[Any, tuple[Path, bytes]]:
        return reopen_snapshot, (self.dir, self.raw)


def _close_descriptors(files: dict[str, int | str]) -> None:
    for relpath, entry in files.items():
        if isinstance(entry, int):
            os.close(entry)
            files[relpath] = "was closed with its zoo"


FOLLOW_LINKS_ENV = "STZ_FOLLOW_LINKS"


def link_base(config_dir: Path) -> Path:
    """The folder a zoo's files may lie in, through links: its root; for a zoo in the Hugging Face cache, whose
    files are links into the repo's blob store, the repo's cache folder."""
    root = config_dir.resolve().parent
    return root.parent.parent if root.parent.name == "snapshots" else root


def _open_regular(path: Path, base: Path) -> int | str:
    """A descriptor of the regular file at `path`, or why there is none. Opened without blocking, so a FIFO put
    where a shard should be is refused rather than waited on; a link that leads out of `base` is refused unless
    the user asks for links to be followed ($STZ_FOLLOW_LINKS=1)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except (FileNotFoundError, NotADirectoryError):
        return "is missing"
    except OSError as exc:
        return f"cannot be opened ({exc.strerror})"
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return "is not a regular file"
    target = opened_path(fd, path)
    if not target.is_relative_to(base) and os.environ.get(FOLLOW_LINKS_ENV) != "1":
        os.close(fd)
        return (f"is a link to {target}, outside the zoo {base}; copy the file into the zoo, or set "
                f"{FOLLOW_LINKS_ENV}=1 to follow links out of it")
    return fd


def opened_path(fd: int, path: Path) -> Path:
    """Where the open file really is (the kernel's own name for the descriptor where there is one)."""
    proc = Path(f"/proc/self/fd/{fd}")
    try:
        return Path(os.readlink(proc))
    except OSError:
        return path.resolve()


def read_manifest(config_dir: Path) -> bytes:
    """`<config_dir>/zoo.json`'s bytes, read as every file of a zoo is (`_open_regular`), within a size bound."""
    path = config_dir / MANIFEST_NAME
    entry = _open_regular(path, link_base(config_dir))
    if isinstance(entry, str):
        if entry == "is missing":
            raise ZooNotFoundError(path, "no zoo manifest here (is this a zoo config folder?)")
        raise ZooDamagedError(path, f"zoo manifest {entry}")
    with os.fdopen(entry, "rb") as handle:
        raw = handle.read(MANIFEST_LIMIT + 1)
    if len(raw) > MANIFEST_LIMIT:
        raise ZooDamagedError(path, f"zoo manifest is larger than {MANIFEST_LIMIT:,} bytes")
    return raw


def open_snapshot(config_dir: str | os.PathLike[str]) -> ZooSnapshot:
    """Read zoo.json and open every file it names; if one is gone and zoo.json changed meanwhile, a writer put a
    new version in place: start again with it. A file still gone under an unchanged manifest is reported when it
    is read, so the rest of the zoo stays readable."""
    config_dir = Path(config_dir)
    for _ in range(OPEN_ATTEMPTS):
        raw = read_manifest(config_dir)
        snapshot = ZooSnapshot(config_dir, raw)
        if snapshot.complete or not replaced_since(config_dir, raw):
            return snapshot
        snapshot.close()
    raise ZooReplacedError(config_dir / MANIFEST_NAME, f"was replaced {OPEN_ATTEMPTS} times while it was being "
                                                       f"opened; open it again when the writer has finished")


def reopen_snapshot(config_dir: Path, raw: bytes) -> ZooSnapshot:
    """The version whose manifest bytes are `raw` opened again (a reader pickled into another process): its files
    are content-addressed, so those still there are that version's bytes."""
    snapshot = ZooSnapshot(config_dir, raw)
    if not snapshot.complete and replaced_since(config_dir, raw):
        snapshot.close()
        raise ZooReplacedError(config_dir / MANIFEST_NAME, "was replaced by a newer version after this reader opened "
                                                           "it, and that version's files are gone; open it again")
    return snapshot


def replaced_since(config_dir: Path, raw: bytes) -> bool:
    """Whether `<config_dir>/zoo.json` is no longer the manifest whose bytes are `raw`."""
    try:
        return read_manifest(config_dir) != raw
    except (OSError, ZooFormatError):
        return True
