"""The one check of a file's bytes against the size and sha256 its manifest gives, for every file and read path."""

from __future__ import annotations

import hashlib

from ..errors import ZooDamagedError, ZooFormatError


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def check_sha256(digest: str, expected: str, path: object) -> None:
    """Raise ZooFormatError naming `path` unless the file's `digest` is the manifest's."""
    if digest != expected:
        raise ZooDamagedError(path, f"sha256 is {digest}, the manifest says {expected}: the file was altered or "
                                   f"damaged")


def check_size(size: int, expected: int, path: object) -> None:
    if size != expected:
        raise ZooDamagedError(path, f"size is {size} bytes, the manifest says {expected} "
                                   f"({'truncated' if size < expected else 'extra bytes'})")


def check_bytes(data: bytes, size: int, sha256: str, path: object) -> None:
    """A whole file read into memory against its manifest entry."""
    check_size(len(data), size, path)
    check_sha256(sha256_bytes(data), sha256, path)
