"""Names the store cannot hold are refused before anything is written, and operating-system errors (a full disk,
a file that cannot be read) reach the user as one line that names the file and what to do."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from small_transformer_zoo import ZooWriter, mnist_spec
from small_transformer_zoo.cli import main
from small_transformer_zoo.format.shards import canonical_header
from small_transformer_zoo.testing.synthetic_release import write_synthetic_release
from tests.helpers import HANG_TIMEOUT, PROJECT

BAD_NAMES = ["zöo", "x" * 250, "-leading-dash", "a b", ".hidden", "", "名前"]


@pytest.mark.parametrize("name", BAD_NAMES, ids=range(len(BAD_NAMES)))
def test_a_writer_refuses_the_name_and_leaves_nothing(tmp_path: Path, stz_home: Path, name: str) -> None:
    root = tmp_path / "zoos"
    with pytest.raises(ValueError, match="a new zoo's name is 1 to 96 ASCII letters"):
        ZooWriter(root, name, mnist_spec())
    assert not root.exists() or not any(root.iterdir())


@pytest.mark.parametrize("name", ["zöo", "y" * 250])
def test_an_import_refuses_the_name_and_leaves_nothing(tmp_path: Path, stz_home: Path, name: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    release = write_synthetic_release(tmp_path / "unpacked", runs=2)
    out = tmp_path / "out"
    assert main(["import-original", str(release.top), str(out), "--config", name, "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "a new zoo's name is 1 to 96" in err
    assert not out.exists() or not any(out.iterdir())


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=8), st.text(max_size=12), max_size=4))
def test_canonical_header_keeps_any_unicode_metadata(metadata: dict[str, str]) -> None:
    """A header written by safetensors (UTF-8, unescaped) keeps its length when sorted: non-ASCII text is never
    escaped into a longer header."""
    header = {"__metadata__": metadata, "params": {"dtype": "F32", "shape": [1, 1], "data_offsets": [0, 4]}}
    raw = json.dumps(header, ensure_ascii=False, separators=(",", ":")).encode()
    data = struct.pack("<Q", len(raw)) + raw + b"\0\0\0\0"
    ordered = canonical_header(data)
    assert len(ordered) == len(data)
    assert json.loads(ordered[8 : 8 + len(raw)]) == header


def test_an_unreadable_submission_is_one_line_naming_it(tmp_path: Path, synthetic_root: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    if not Path("/proc/self/mem").exists():
        pytest.skip("no /proc/self/mem on this system")
    link = tmp_path / "submission.csv"
    link.symlink_to("/proc/self/mem")
    code = main(["score", str(link), "--zoo", str(synthetic_root), "--config", "syn", "--split", "test"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and len(err.splitlines()) == 1
    assert str(link) in err and "give a regular file" in err
    from nfn_baselines.leaderboard.scoring import SubmissionError, score_submission

    with pytest.raises(SubmissionError, match=r"submission.csv: cannot be read \(Input/output error\); give a regular"):
        score_submission(link, synthetic_root, "syn", "test")


def test_a_write_the_system_refuses_names_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    """A write cut short by the system (here the file-size limit, as a full disk cuts it) names the file it was
    writing, and leaves neither the file nor its temporary."""
    target = tmp_path / "results.json"
    script = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (1000, 1000))\n"
        "from small_transformer_zoo.store.files import atomic_write_bytes\n"
        "from small_transformer_zoo.errors import os_error_text\n"
        "try:\n"
        "    atomic_write_bytes(sys.argv[1], b'x' * 100_000)\n"
        "except OSError as exc:\n"
        "    print(os_error_text(exc))\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(target)], capture_output=True, text=True, timeout=HANG_TIMEOUT,
                          cwd=PROJECT, env={**os.environ, "PYTHONPATH": "."})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().startswith(f"{target}: File too large; ")
    assert list(tmp_path.iterdir()) == []
