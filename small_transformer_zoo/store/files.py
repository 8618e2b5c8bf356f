"""File helpers every writer shares: atomic writes, hashing, and the package's own home folder."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import stat
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from ..errors import ZooArgumentError, ZooDamagedError, naming_file

CREATE_MODE = 0o666  # what open() asks for; the process umask takes its share (0644 under the usual 022)


def _umask() -> int:
    """The process umask: from /proc on Linux (no change to the process), else by setting it and putting it back."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def stz_home() -> Path:
    """Where the package keeps its own state (registry of local zoos, verification stamps): $STZ_HOME or ~/.cache."""
    env = os.environ.get("STZ_HOME")
    return Path(env) if env else Path.home() / ".cache" / "small_transformer_zoo"


def check_stz_home() -> Path:
    """`stz_home()`, refused at once when something other than a folder is there (before a zoo is written that
    could then not be registered)."""
    home = stz_home()
    if (home.exists() or home.is_symlink()) and not home.is_dir():
        raise ZooArgumentError(home, "the package's state folder ($STZ_HOME, else ~/.cache/small_transformer_zoo) is "
                                     "a file; point STZ_HOME at a folder, or remove the file")
    return home


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write to a temporary name in the same folder, fsync, rename, fsync the folder: never a half-written file at
    `path`, and renames reach the disk in the order they were made."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with naming_file(path), os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), CREATE_MODE & ~_umask())  # mkstemp makes 0600; files are for the team
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable, so that after a power cut a manifest never names a file that is lost."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_regular_text(path: str | os.PathLike[str], limit: int) -> str | None:
    """The text of a regular file of at most `limit` bytes, or None where there is none; never follows a link,
    waits on a FIFO or reads a device (a ValueError names anything else that sits at `path`)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read as a regular file ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ValueError(f"{path}: not a regular file (a FIFO, device or folder); move it away")
        if st.st_size > limit:
            raise ValueError(f"{path}: {st.st_size:,} bytes, more than the {limit:,} this file may have")
        with os.fdopen(os.dup(fd), "rb") as handle:
            return handle.read(limit + 1)[:limit].decode(errors="replace")
    finally:
        os.close(fd)


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Strict JSON (a NaN or infinity is an error, never the non-standard `NaN` token), written atomically."""
    atomic_write_bytes(path, (json.dumps(obj, indent=2, sort_keys=False, allow_nan=False) + "\n").encode())


def _open_lock_file(path: Path) -> Any:
    """The lock file opened for reading and writing: a regular file created here if need be, never a link
    followed to another file or a FIFO waited on."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, CREATE_MODE)
    except OSError as exc:
        kind = "a symbolic link" if path.is_symlink() else "not a writable file"
        raise ValueError(f"{path}: the lock file is {kind} ({exc.strerror}); writers never follow a link or "
                         f"write through one: remove it") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(f"{path}: the lock file is not a regular file (a FIFO or device); remove it")
    return os.fdopen(fd, "r+")


def check_real_folders(root: Path, relative: Path) -> None:
    """Every part of `root / relative` that exists is a real folder, not a link: a writer creates, replaces and
    deletes only regular files and folders inside the root, never through a link to somewhere else."""
    current = root
    for part in relative.parts:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            return
        if stat.S_ISLNK(mode):
            raise ValueError(f"{current}: is a symbolic link; a zoo writer writes and deletes only inside the zoo's "
                             f"own folders, never through a link: replace it with a folder")
        if not stat.S_ISDIR(mode):
            raise ValueError(f"{current}: is not a folder")


class LockedError(FileExistsError):
    """Another process holds the lock of what this process was about to write."""


_HOLDERS: dict[str, int] = {}  # lock file -> the thread of this process that holds it
_HOLDERS_GUARD = threading.Lock()


@contextmanager
def exclusive_lock(folder: str | os.PathLike[str], name: str, purpose: str, wait: float = 0.0) -> Iterator[None]:
    """Hold `<folder>/.<name>.lock` exclusively for the block. With `wait` 0 (zoo writers) fail at once, naming the
    holder, if another process or thread has it; else wait up to `wait` seconds for it (writers of a small shared
    file, who read it again under the lock). The lock sits beside what it guards, so replacing that folder whole
    keeps it. The thread that holds it may enter it again: a build holds it while it trains and while its
    `ZooWriter` writes.

    An advisory `flock`: released by the kernel when the holder exits, however it exits, so a killed writer never
    leaves a stale lock. The file keeps who holds it (pid, host, purpose, start) for the message. The holder
    removes the file as it lets go (a killed holder's file is reused, then removed by the next), so no lock file
    stays behind.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f".{name}.lock"
    key, me = str(path.resolve()), threading.get_ident()
    with _HOLDERS_GUARD:
        holder = _HOLDERS.get(key)
    if holder == me:  # this thread holds it already, e.g. a build's writer under the build's lock
        yield
        return
    deadline = time.monotonic() + wait
    while True:
        handle = _open_lock_file(path)
        busy = _try_lock(handle, key, me)
        while busy is not None and time.monotonic() < deadline:
            time.sleep(0.02)
            busy = _try_lock(handle, key, me)
        if busy is not None:
            handle.close()
            waited = f" (waited {wait:g} s)" if wait else ""
            raise LockedError(f"{folder / name} is being written by {busy}{waited}; wait for it or choose "
                              f"another folder")
        if _still_there(handle, path):
            break
        with _HOLDERS_GUARD:  # its holder removed the file as it let go: take the lock of the file there now
            del _HOLDERS[key]
        handle.close()
    try:
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()} ({purpose}, since "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')})\n")
        handle.flush()
        yield
    finally:
        path.unlink(missing_ok=True)  # while held: whoever waits on this file sees it gone and takes the next one
        with _HOLDERS_GUARD:
            del _HOLDERS[key]
        handle.close()


def _still_there(handle: Any, path: Path) -> bool:
    """Whether the locked file is still the one at `path` (a holder removes its lock file as it lets go)."""
    try:
        return os.stat(path, follow_symlinks=False).st_ino == os.fstat(handle.fileno()).st_ino
    except FileNotFoundError:
        return False


def read_small_file(path: str | os.PathLike[str], what: str, limit: int = 64 << 20) -> bytes | None:
    """The bytes of a small file the package keeps (a registry, a results file), or None when there is none. It
    must be a regular file: opened without blocking and checked before any read, so a FIFO or a device in its place
    is an error naming it, never a read that waits for good."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ZooDamagedError(path, f"is not a regular file (a FIFO, device or folder where {what} should be); "
                                        f"remove it")
        with naming_file(path):
            data = handle.read(limit + 1)
    if len(data) > limit:
        raise ZooDamagedError(path, f"is larger than {limit >> 20} MiB: not {what}")
    return data


SHARED_FILE_WAIT = 120.0  # seconds a writer of a small shared file waits for another writer of it


def _try_lock(handle: Any, key: str, me: int) -> str | None:
    """Take the lock for this thread; None when taken, else who holds it."""
    with _HOLDERS_GUARD:
        if key in _HOLDERS:
            return "another thread of this process"
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            return handle.read().strip() or "another process"
        _HOLDERS[key] = me
        return None


@contextmanager
def shared_file_update(path: str | os.PathLike[str], purpose: str) -> Iterator[None]:
    """Hold the lock of a small file that several processes update (a results file, the registry of local zoos),
    waiting for another writer: read it, change it and write it back inside the block, so no writer's update is
    lost."""
    path = Path(path)
    with exclusive_lock(path.parent, path.name, purpose, wait=SHARED_FILE_WAIT):
        yield
