"""Run a command and report the peak of its whole process tree's memory: the sum of every live process's
proportional set size (PSS: shared pages split between the processes that map them), sampled twice a second.
`/usr/bin/time` reports only the largest single process; a laptop feels the sum.

    python .ci/tree_memory.py REPORT -- COMMAND...

Writes `peak_pss_kib <n>` to REPORT and exits with the command's exit code (Linux only: it reads /proc).
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def descendants(pid: int) -> list[int]:
    """`pid` and every process below it, as /proc lists them now."""
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        try:
            todo += [int(child) for child in Path(f"/proc/{current}/task/{current}/children").read_text().split()]
        except OSError:
            pass
    return found


def pss_kib(pid: int) -> int:
    """A process's PSS in KiB, or 0 once it has ended."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return 0


def main() -> int:
    report, separator, *command = sys.argv[1:]
    if separator != "--" or not command:
        sys.exit("usage: tree_memory.py REPORT -- COMMAND...")
    process = subprocess.Popen(command)
    peak = 0
    while process.poll() is None:
        peak = max(peak, sum(pss_kib(pid) for pid in descendants(process.pid)))
        time.sleep(0.5)
    Path(report).write_text(f"peak_pss_kib {peak}\n")
    return process.returncode


if __name__ == "__main__":
    sys.exit(main())
