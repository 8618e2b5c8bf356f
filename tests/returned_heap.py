"""The suite's memory stays that of its largest test, not the sum of what native libraries keep.

glibc keeps freed memory for reuse, which costs this long-lived process in two ways:
- After each test, the heap it freed goes back to the operating system (`malloc_trim`). One LightGBM fit's
  histogram pool (about 1.2 GB on 18,506 features) otherwise stays for every later test.
- Blocks of 4 MiB and more are mapped on their own and unmapped when freed. By default glibc raises that
  threshold each time such a block is freed (up to 32 MiB), after which tensors of a few MiB come from the heap and
  leave it fragmented: what a test frees between live blocks cannot go back. Measured on the builder's tests (39 of
  them in one process, threshold fixed at 1 MiB): 513 MiB of anonymous memory held after them with the default,
  354 MiB with the threshold fixed; on the whole suite, the process's peak went from 1,558 to 1,207 MiB. At 1 MiB,
  though, a builder's activations (about 1 MiB a tensor) take fresh pages at every step: a colour-task `mini`
  build of 3 epochs took 32.2 s (21.6 s of system time) against 20.9 s (1.6 s) with the default and 22.1 s
  (2.8 s) at 4 MiB, whose peak RSS (667 MiB) lies between the two (623, 710). The whole suite at 4 MiB: 1,358 s,
  204 s of system time, largest process 1,355 MiB; at 1 MiB, the same day (without the colour zoo's shorter
  build, about 50 s of the difference): 1,533 s, largest process 1,295 MiB. Subprocesses the tests start get the
  same setting through `MALLOC_MMAP_THRESHOLD_`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
from collections.abc import Iterator

import pytest

MMAP_THRESHOLD = 4 << 20
_M_MMAP_THRESHOLD = -3  # mallopt's parameter number in glibc's malloc.h


def _glibc() -> ctypes.CDLL | None:
    """The C library when it is glibc (it has `malloc_trim`), else None (macOS, musl)."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name) if name else None
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None


_LIBC = _glibc()
if _LIBC is not None:
    _LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", str(MMAP_THRESHOLD))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    yield
    if _LIBC is not None:
        gc.collect()
        _LIBC.malloc_trim(0)
