"""Errors about data, by kind, under one base.

`ZooFormatError` is the base of every error about a zoo: catching it catches them all, as code written before the
kinds existed does. Its kinds say what went wrong, so a caller can tell them apart:

| kind | what | also a |
|---|---|---|
| `ZooNotFoundError` | a zoo, config, split or file that is not there | `FileNotFoundError` |
| `ZooArgumentError` | an argument the zoo cannot take (a config it is not, a name that needs a config) | `ValueError` |
| `ZooDamagedError` | a file that is there but damaged, truncated or inconsistent with the others | `ValueError` |
| `ZooHubError` | the Hub or the network failed, or answered with an error | |

Every kind is a `DataError` (a `ValueError`): the base the `stz` command maps to exit code 1, a problem in the
data or files it was given, as against a bad flag.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager


class DataError(ValueError):
    """A problem in the data or files a command was given; the message names the file and what is wrong."""


class ZooFormatError(DataError):
    """The base of every zoo error: the message names the file (or name) and what is wrong. Raise one of its
    kinds; catch it to catch them all."""

    def __init__(self, path: str | os.PathLike[str] | None, problem: str | None = None) -> None:
        """`(path, problem)`; called with one text, that text is the whole message: so torch's DataLoader, which
        raises a worker's error again as `type(message)`, hands the caller this kind of error, not a
        RuntimeError."""
        if problem is None:
            path, problem = None, str(path)
        self.path = None if path is None else os.fspath(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}" if self.path else problem)

    def __reduce__(self) -> tuple[type, tuple[str | None, str]]:
        """Pickled with its two arguments, so it crosses from a worker process intact."""
        return type(self), (self.path, self.problem)

    def __str__(self) -> str:
        return f"{self.path}: {self.problem}" if self.path else self.problem


class ZooNotFoundError(ZooFormatError, FileNotFoundError):
    """A zoo, config, split or file asked for is not there (or, offline, not in the cache)."""


class ZooArgumentError(ZooFormatError):
    """An argument the zoo cannot take: a config that it is not, a name that needs a config, an ambiguous root."""


class ZooDamagedError(ZooFormatError):
    """A file is there but damaged, truncated, altered, or inconsistent with the manifest or the other files."""


class ZooHubError(ZooFormatError):
    """The Hub or the network failed, or the Hub answered with an error."""


class ZooReplacedError(ZooNotFoundError):
    """A newer version replaced the zoo, and the files of the version a reader opened are gone; opening the zoo
    again gives the new version."""


class LabelsWithheldError(ZooArgumentError):
    """The zoo is a leaderboard's public copy: the metric columns asked for are withheld in this split."""


@contextmanager
def hub_errors(what: str, where: str | None = None, then: str = "",
               passthrough: type[Exception] | tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """A network failure or an error answer of the Hub inside the block becomes one error,
    `<where>: <what> failed (<type>: <message>)<then>`: a ZooNotFoundError for a repo, revision or file the Hub
    does not have (or, offline, the cache lacks), a ZooHubError for the rest. `passthrough` errors, and zoo
    errors raised inside, reach the caller as they are."""
    from httpx2 import HTTPError  # huggingface_hub's HTTP client: every network and HTTP error derives from it
    from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        yield
    except (ZooFormatError, *(passthrough if isinstance(passthrough, tuple) else (passthrough,))):
        raise
    except (HTTPError, OSError, EntryNotFoundError) as exc:
        missing = isinstance(exc, (EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError))
        kind = ZooNotFoundError if missing and not _server_failed(exc) else ZooHubError
        raise kind(where, f"{what} failed ({type(exc).__name__}: {' '.join(str(exc).split())}){then}") from None


def _server_failed(exc: BaseException) -> bool:
    """Whether a "not found" from huggingface_hub only means that the Hub failed (an error status of 500 or more
    on the way, with nothing in the cache to fall back on), not that it answered that the file is not there."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if getattr(response, "status_code", 0) >= 500:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


_REMEDIES = {
    errno.ENOSPC: "the disk is full: free space on it, or write somewhere else",
    errno.EDQUOT: "the disk quota is used up: free space, or write somewhere else",
    errno.EFBIG: "the file would pass the size this process may write (ulimit -f): raise it, or write less",
    errno.EIO: "it cannot be read or written (a device or special file, or a failing disk): give a regular file",
    errno.ENAMETOOLONG: "the name is too long for the file system: choose a shorter one",
    errno.EACCES: "no permission: choose a folder this user may use",
    errno.EROFS: "the file system is read-only: write somewhere else",
}


@contextmanager
def naming_file(path: str | os.PathLike[str]) -> Iterator[None]:
    """An OSError inside the block that names no file (a failed read or write on an open handle) is raised again
    naming `path`, so every error message says which file."""
    try:
        yield
    except OSError as exc:
        if exc.filename is not None or exc.errno is None:
            raise
        raise OSError(exc.errno, exc.strerror, os.fspath(path)) from exc


def os_error_text(exc: OSError) -> str:
    """One line for an OSError: the file, what went wrong, and what to do where that is known."""
    where = f"{exc.filename}: " if exc.filename is not None else ""
    remedy = _REMEDIES.get(exc.errno or -1)
    return f"{where}{exc.strerror or exc}" + (f"; {remedy}" if remedy else "")
