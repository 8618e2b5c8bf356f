"""Stamps for shards whose sha256 was checked on this machine, so the fast path hashes each file once.

A stamp records the file's real path, size, mtime, ctime and inode next to the hash it matched. Any write to the
file changes its ctime, which no user call can set back (unlike mtime), so a rewrite, a truncation or a
replacement is hashed again on the next load.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import BinaryIO

from ..format.checksums import check_sha256, check_size
from .files import atomic_write_bytes, stz_home


def _stamp_path(path: Path) -> Path:
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()
    return stz_home() / "verified" / key


def file_version(st: os.stat_result) -> tuple[int, ...]:
    """What identifies one version of a file: any write, truncation or replacement changes it (ctime included)."""
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _fingerprint(path: Path, st: os.stat_result, sha256: str) -> str:
    return f"{path.resolve()}\n{st.st_size}\n{st.st_mtime_ns}\n{st.st_ctime_ns}\n{st.st_ino}\n{sha256}\n"


def is_stamped(path: str | os.PathLike[str], st: os.stat_result, sha256: str) -> bool:
    """Whether this version of the file (`st`) was checked against `sha256` (a digest, or another key of what
    was checked) on this machine."""
    path = Path(path)
    try:
        return _stamp_path(path).read_text() == _fingerprint(path, st, sha256)
    except OSError:
        return False


def stamp(path: str | os.PathLike[str], st: os.stat_result, sha256: str) -> None:
    """Record that this version of the file was checked against `sha256`."""
    path = Path(path)
    try:
        atomic_write_bytes(_stamp_path(path), _fingerprint(path, st, sha256).encode())
    except OSError:
        pass  # a read-only home only costs a re-hash next time


VERIFY_MODES = ("once", "always", "never")


def check_verify_mode(mode: str) -> str:
    """`mode` if it is a verification mode; a mistyped one is an error, never a silent skip of the hash."""
    if mode not in VERIFY_MODES:
        raise ValueError(f"verify={mode!r}: choose one of {list(VERIFY_MODES)}")
    return mode


def check_open_file(handle: BinaryIO, path: str | os.PathLike[str], size: int, sha256: str,
                    mode: str = "once") -> None:
    """Raise ZooFormatError unless the open file has the manifest's size and (per `mode`) sha256.

    Everything is checked through the open handle, so what was checked is what the caller then reads or maps,
    even if the path is replaced meanwhile. "once": hash the first time this machine reads this version of the
    file (same size, mtime, ctime and inode); "always"; "never"."""
    check_verify_mode(mode)
    path = Path(path)
    st = os.fstat(handle.fileno())
    check_size(st.st_size, size, path)
    if mode == "always" or (mode == "once" and not is_stamped(path, st, sha256)):
        handle.seek(0)
        digest = hashlib.file_digest(handle, "sha256").hexdigest()
        check_sha256(digest, sha256, path)
        stamp(path, st, digest)
    handle.seek(0)


def _rows_stamp(content: list[str]) -> Path:
    return stz_home() / "verified" / ("rows-" + hashlib.sha256("\n".join(content).encode()).hexdigest())


def rows_checked(content: list[str]) -> bool:
    """Whether the rows of a split were checked against their digests on this machine, for the metadata and
    shards of these sha256s (`content`)."""
    return _rows_stamp(content).is_file()


def stamp_rows_checked(content: list[str]) -> None:
    try:
        atomic_write_bytes(_rows_stamp(content), b"")
    except OSError:
        pass  # a read-only home only costs a check next time
