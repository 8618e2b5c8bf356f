"""CI's memory check (`.ci/tree_memory.py`): the peak it reports holds what a child process touched, and the
command's exit code passes through."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import PROJECT

SCRIPT = PROJECT / ".ci" / "tree_memory.py"
HOLD = """
import subprocess, sys
child = "import time; block = bytearray({mib} << 20); block[::4096] = b'x' * len(block[::4096]); time.sleep(1.5)"
subprocess.run([sys.executable, "-c", child], check=True)
sys.exit({code})
"""


@pytest.mark.skipif(not Path("/proc/self/smaps_rollup").exists(), reason="needs Linux's /proc/<pid>/smaps_rollup")
@pytest.mark.parametrize(("mib", "code"), [(300, 0), (120, 3)])
def test_the_peak_counts_a_grandchild_and_the_exit_code_passes_through(tmp_path: Path, mib: int, code: int) -> None:
    report = tmp_path / "report"
    done = subprocess.run([sys.executable, str(SCRIPT), str(report), "--", sys.executable, "-c",
                           HOLD.format(mib=mib, code=code)])
    assert done.returncode == code
    name, value = report.read_text().split()
    assert name == "peak_pss_kib" and mib * 1024 <= int(value) < (mib + 400) * 1024


def test_a_command_line_without_its_separator_is_refused(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path / "report"), "true"], capture_output=True,
                          text=True)
    assert done.returncode != 0 and "usage" in done.stderr
