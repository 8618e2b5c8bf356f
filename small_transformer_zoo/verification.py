"""Stamps for shards whose sha256 was checked on this machine, so the fast path hashes each file once.

A stamp records the file's real path, size, mtime, ctime and inode next to the hash it matched. Any write to the
file changes its ctime, which no user call can set back (unlike mtime), so a rewrite, a truncation or a
replacement is hashed again on the next load.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .errors import ZooFormatError
from .files import atomic_write_bytes, sha256_file, stz_home


def _stamp_path(path: Path) -> Path:
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()
    return stz_home() / "verified" / key


def _fingerprint(path: Path, sha256: str) -> str:
    st = os.stat(path)
    return f"{path.resolve()}\n{st.st_size}\n{st.st_mtime_ns}\n{st.st_ctime_ns}\n{st.st_ino}\n{sha256}\n"


def is_verified(path: str | os.PathLike[str], sha256: str) -> bool:
    path = Path(path)
    try:
        return _stamp_path(path).read_text() == _fingerprint(path, sha256)
    except OSError:
        return False


def mark_verified(path: str | os.PathLike[str], sha256: str) -> None:
    path = Path(path)
    try:
        atomic_write_bytes(_stamp_path(path), _fingerprint(path, sha256).encode())
    except OSError:
        pass  # a read-only home only costs a re-hash next time


def check_file(path: str | os.PathLike[str], size: int, sha256: str, mode: str = "once") -> None:
    """Raise ZooFormatError unless the file has the manifest's size and (per `mode`) sha256.

    "once": hash the first time this machine reads the file and whenever it changes; "always"; "never".
    """
    path = Path(path)
    if not path.is_file():
        raise ZooFormatError(path, "file is missing")
    actual = path.stat().st_size
    if actual != size:
        raise ZooFormatError(path, f"size is {actual} bytes, the manifest says {size} "
                                   f"({'truncated' if actual < size else 'extra bytes'})")
    if mode == "always" or (mode == "once" and not is_verified(path, sha256)):
        digest = sha256_file(path)
        if digest != sha256:
            raise ZooFormatError(path, f"sha256 is {digest}, the manifest says {sha256}: "
                                       f"the file was altered or damaged")
        mark_verified(path, digest)
