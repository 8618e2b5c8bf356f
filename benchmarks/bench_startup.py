"""Start-up time: `import small_transformer_zoo`, `stz --version` and `stz --help`, each in a fresh interpreter,
against an interpreter that imports nothing (the floor), and the import's own time from `python -X importtime`.

    python benchmarks/bench_startup.py
"""

from __future__ import annotations

import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROJECT = Path(__file__).resolve().parents[1]
REPEATS = 7


def seconds(argv: list[str]) -> float:
    """Median wall time of `argv` over REPEATS runs (each a fresh process)."""
    times = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        subprocess.run(argv, cwd=PROJECT, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def import_time(module: str) -> float:
    """The cumulative import time of `module` that `python -X importtime` reports, in seconds."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], cwd=PROJECT, check=True,
                         capture_output=True, text=True).stderr
    line = next(line for line in out.splitlines() if re.search(rf"\| {re.escape(module)}$", line))
    return int(line.split("|")[1]) / 1e6


def main() -> None:
    stz = shutil.which("stz") or f"{Path(sys.executable).parent / 'stz'}"
    floor = seconds([sys.executable, "-c", "pass"])
    print(f"fresh interpreter, median of {REPEATS} runs each (python -c pass: {floor * 1e3:.0f} ms)")
    for label, argv in (("import small_transformer_zoo", [sys.executable, "-c", "import small_transformer_zoo"]),
                        ("import small_transformer_zoo.cli", [sys.executable, "-c", "import small_transformer_zoo.cli"]),
                        ("stz --version", [stz, "--version"]), ("stz --help", [stz, "--help"]),
                        ("stz bench --help", [stz, "bench", "--help"])):
        took = seconds(argv)
        print(f"  {label:<34}{took * 1e3:8.0f} ms   {took - floor:6.3f} s above the floor")
    print(f"python -X importtime: import small_transformer_zoo {import_time('small_transformer_zoo') * 1e3:.1f} ms "
          f"(cumulative)")


if __name__ == "__main__":
    main()
