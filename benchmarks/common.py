"""Shared benchmark helpers: a loopback Hub set up before huggingface_hub is imported, timing, zoo fixtures."""

from __future__ import annotations

import atexit
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))

from small_transformer_zoo.testing import free_loopback_port  # noqa: E402  (does not import huggingface_hub)

if os.environ.get("STZ_BENCH_DIR"):
    WORK = Path(os.environ["STZ_BENCH_DIR"])
else:
    WORK = Path(tempfile.mkdtemp(prefix="stz-bench-"))
    atexit.register(shutil.rmtree, WORK, ignore_errors=True)


# huggingface_hub reads these once, at import, and the package imports it: set them before anything is imported.
PORT = free_loopback_port()
os.environ.update(HF_ENDPOINT=f"http://127.0.0.1:{PORT}", HF_HUB_DISABLE_XET="1", HF_HOME=str(WORK / "hf-home"),
                  HF_DATASETS_CACHE=str(WORK / "hf-datasets"), STZ_HOME=str(WORK / "stz-home"),
                  HF_HUB_DISABLE_TELEMETRY="1", HF_DATASETS_DISABLE_PROGRESS_BARS="1")

from small_transformer_zoo.testing import HubServer  # noqa: E402


def start_hub() -> HubServer:
    """Start the loopback Hub that HF_ENDPOINT points at."""
    return HubServer(PORT).__enter__()


def timed(fn: Callable[[], object], repeat: int = 3) -> tuple[float, object]:
    """Median wall time of `repeat` calls, and the last result."""
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def row(label: str, seconds: float, amount: float, unit: str, baseline: float | None = None,
        baseline_label: str = "") -> str:
    rate = amount / seconds
    ratio = f"  {rate / baseline:6.2f}x {baseline_label}" if baseline else ""
    return f"  {label:<52}{seconds * 1e3:10.1f} ms {rate:14,.0f} {unit}{ratio}"
