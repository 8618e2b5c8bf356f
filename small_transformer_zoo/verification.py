"""Stamps for shards whose sha256 was checked on this machine, so the fast path hashes each file once.

A stamp records the file's real path, size, mtime and inode next to the hash it matched; any change to the file
(rewrite, truncation, replacement) changes one of these and the next load hashes it again.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .files import atomic_write_bytes, stz_home


def _stamp_path(path: Path) -> Path:
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()
    return stz_home() / "verified" / key


def _fingerprint(path: Path, sha256: str) -> str:
    st = os.stat(path)
    return f"{path.resolve()}\n{st.st_size}\n{st.st_mtime_ns}\n{st.st_ino}\n{sha256}\n"


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
