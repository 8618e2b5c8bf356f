"""Leaderboard submissions: every kind of bad file gets one clear error; fuzzed input never escapes as anything
but SubmissionError; valid CSV and Parquet score like the benchmark; the results file ranks entries."""

import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nfn_baselines.bench.submission import write_submission
from nfn_baselines.leaderboard.scoring import (SubmissionError, add_result, load_leaderboard, read_submission,
                                               render_leaderboard, score_submission)
from nfn_baselines.models.metrics import scores
from small_transformer_zoo import Zoo
from small_transformer_zoo.cli import main
from tests.helpers import PROJECT


@pytest.fixture(scope="module")
def truth(synthetic_root: Path) -> tuple[list[str], np.ndarray]:
    meta = Zoo.open(synthetic_root, "syn").metadata("test")
    return meta.column("checkpoint_id").to_pylist(), np.asarray(meta.column("test_accuracy").to_pylist())


def _csv(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n")
    return path


def test_valid_csv_and_parquet_score_like_the_benchmark(synthetic_root: Path, truth, tmp_path: Path) -> None:
    ids, true = truth
    predicted = np.clip(true + np.random.default_rng(0).normal(0, 0.05, len(true)), 0.0, 1.0)
    csv_path = write_submission(tmp_path / "sub.csv", ids[::-1], predicted[::-1])
    parquet_path = tmp_path / "sub.parquet"
    pq.write_table(pa.table({"checkpoint_id": ids, "predicted_accuracy": predicted}), parquet_path)
    expected = scores(predicted, true)
    for path in (csv_path, parquet_path):
        got = score_submission(path, synthetic_root, "syn", "test")
        assert got["tau"] == pytest.approx(expected["tau"]) and got["l1"] == pytest.approx(expected["l1"], rel=1e-6)


@pytest.mark.parametrize("lines,message", [
    (["checkpoint_id,predicted_accuracy"], "no rows after the header"),
    (["id,prediction", "a,0.5"], r"columns must be exactly \['checkpoint_id', 'predicted_accuracy'\]"),
    (["checkpoint_id", "a"], "missing \\['predicted_accuracy'\\]"),
    (["checkpoint_id,predicted_accuracy,extra", "a,0.5,1"], "unexpected \\['extra'\\]"),
    (["checkpoint_id,predicted_accuracy", "a,0.5", "b,high", "c,", "d,0.1"], r"not a number at CSV lines 'high'|lines 3, 4"),
    (["checkpoint_id,predicted_accuracy", "a,nan", "b,inf", "c,0.2"], r"NaN or infinite at CSV lines 2, 3 \(2 in all\)"),
    (["checkpoint_id,predicted_accuracy", "a,0.5", "a,0.6", "b,0.1", "b,0.2"], r"more than once: 'a', 'b' \(2 in all\)"),
    (["checkpoint_id,predicted_accuracy", "a,0.5,9"], "number of cells differs"),
    (["checkpoint_id,predicted_accuracy", ",0.5"], "empty checkpoint_id at CSV lines 2"),
    (["checkpoint_id,predicted_accuracy", "a,1.5", "b,-0.1", "c,0.3"], r"outside \[0, 1\] at CSV lines 2, 3"),
    (["checkpoint_id,predicted_accuracy", "a,1e300"], r"outside \[0, 1\] at CSV lines 2"),
    (["checkpoint_id,predicted_accuracy", "a,\u0665", "b,\uff10.5"], r"not a number at CSV lines 2, 3"),
    (["checkpoint_id,predicted_accuracy", "a,1_0"], r"not a number at CSV lines 2"),
])
def test_bad_submissions(tmp_path: Path, lines: list[str], message: str) -> None:
    with pytest.raises(SubmissionError, match=message):
        read_submission(_csv(tmp_path / "s.csv", lines))


def test_empty_and_binary_files(tmp_path: Path) -> None:
    (tmp_path / "empty.csv").write_bytes(b"")
    with pytest.raises(SubmissionError, match="empty.csv: the file is empty"):
        read_submission(tmp_path / "empty.csv")
    (tmp_path / "blob.bin").write_bytes(bytes(range(256)))
    with pytest.raises(SubmissionError, match="neither CSV .* nor Parquet"):
        read_submission(tmp_path / "blob.bin")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(SubmissionError, match="not a readable Parquet file"):
        read_submission(tmp_path / "bad.parquet")


def test_missing_and_unknown_ids_are_listed(synthetic_root: Path, truth, tmp_path: Path) -> None:
    ids, true = truth
    path = write_submission(tmp_path / "partial.csv", ids[1:], true[1:])
    with pytest.raises(SubmissionError, match=rf"checkpoints with no prediction: '{ids[0]}' \(1 in all\)"):
        score_submission(path, synthetic_root, "syn", "test")
    path = write_submission(tmp_path / "extra.csv", ids + ["nope-1", "nope-2"], np.append(true, [0.1, 0.2]))
    with pytest.raises(SubmissionError, match=r"not checkpoints of syn/test: 'nope-1', 'nope-2' \(2 in all\)"):
        score_submission(path, synthetic_root, "syn", "test")


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=400))
def test_fuzzed_bytes_never_escape(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzz.csv"
    path.write_bytes(data)
    try:
        ids, values = read_submission(path)
    except SubmissionError:
        return
    assert len(ids) == len(set(ids)) == len(values) and np.isfinite(values).all()


cells = st.one_of(st.text(max_size=8), st.floats(allow_nan=True, allow_infinity=True).map(str),
                  st.sampled_from(["", "nan", "1e999", "-0", "0.5", "a,b", '"q"']))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(st.tuples(cells, cells), max_size=8))
def test_fuzzed_csv_rows_are_accepted_only_when_valid(tmp_path: Path, rows: list[tuple[str, str]]) -> None:
    import csv

    path = tmp_path / "rows.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["checkpoint_id", "predicted_accuracy"])
        writer.writerows(rows)
    try:
        ids, values = read_submission(path)
    except SubmissionError:
        return
    assert np.isfinite(values).all() and all(ids) and len(set(ids)) == len(ids)
    assert all(math.isfinite(float(v)) for _, v in rows if _.strip())


def test_leaderboard_ranks_and_replaces(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    board = tmp_path / "board.json"
    add_result(board, "weak", "syn", "test", {"tau": 0.1, "r2": 0.0, "l1": 0.3, "tau@0.2": 0.1}, "x")
    add_result(board, "strong", "syn", "test", {"tau": 0.8, "r2": 0.5, "l1": 0.1, "tau@0.2": 0.7}, "y")
    add_result(board, "weak", "syn", "test", {"tau": 0.3, "r2": 0.1, "l1": 0.2, "tau@0.2": 0.2}, "z")
    entries = load_leaderboard(board)
    assert [e["name"] for e in entries] == ["strong", "weak"]
    text = render_leaderboard(entries)
    assert text.index("| 1 | strong |") < text.index("| 2 | weak | 0.300")
    assert main(["leaderboard", str(board)]) == 0 and "| 1 | strong |" in capsys.readouterr().out


def test_stz_score_cli(synthetic_root: Path, truth, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ids, true = truth
    path = write_submission(tmp_path / "mine.csv", ids, true)
    assert main(["score", str(path), "--zoo", str(synthetic_root), "--config", "syn", "--leaderboard",
                 str(tmp_path / "b.json"), "--name", "oracle"]) == 0
    assert "tau" in capsys.readouterr().out
    assert load_leaderboard(tmp_path / "b.json")[0]["metrics"]["tau"] == pytest.approx(1.0)
    bad = _csv(tmp_path / "bad.csv", ["checkpoint_id,predicted_accuracy", "x,1"])
    assert main(["score", str(bad), "--zoo", str(synthetic_root), "--config", "syn"]) == 1
    assert "not checkpoints of syn/test" in capsys.readouterr().err


def test_only_regular_files_within_the_limits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    import nfn_baselines.leaderboard.scoring as leaderboard

    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    with pytest.raises(SubmissionError, match="pipe.csv: not a regular file"):
        read_submission(fifo)
    with pytest.raises(SubmissionError, match="not a regular file"):
        read_submission(Path("/dev/zero"))
    with pytest.raises(SubmissionError, match="not a regular file"):
        read_submission(tmp_path)
    monkeypatch.setattr(leaderboard, "MAX_BYTES", 1000)
    big = _csv(tmp_path / "big.csv", ["checkpoint_id,predicted_accuracy"] + [f"c{i},0.5" for i in range(200)])
    with pytest.raises(SubmissionError, match="big.csv: larger than the 1,000 bytes"):
        read_submission(big)
    monkeypatch.setattr(leaderboard, "MAX_BYTES", 10_000_000)
    monkeypatch.setattr(leaderboard, "MAX_ROWS", 100)
    with pytest.raises(SubmissionError, match="big.csv: more than the 100 rows"):
        read_submission(big)
    bomb = tmp_path / "bomb.parquet"  # one repeated value: a few KB on disk, far more decoded
    pq.write_table(pa.table({"checkpoint_id": ["x" * 1000] * 5000, "predicted_accuracy": [0.5] * 5000}), bomb,
                   compression="zstd")
    monkeypatch.setattr(leaderboard, "MAX_ROWS", 10_000)
    monkeypatch.setattr(leaderboard, "MAX_BYTES", 1_000_000)
    assert bomb.stat().st_size < 1_000_000
    with pytest.raises(SubmissionError, match=r"bomb.parquet: decodes to more than the 1,000,000 bytes"):
        read_submission(bomb)


def test_damaged_parquet_is_always_a_clear_error(tmp_path: Path) -> None:
    good = tmp_path / "good.parquet"
    pq.write_table(pa.table({"checkpoint_id": [f"c{i}" for i in range(50)], "predicted_accuracy": [0.5] * 50}), good)
    data = good.read_bytes()
    rng = np.random.default_rng(0)
    for trial in range(20):
        damaged = bytearray(data)
        for position in rng.integers(4, len(data) - 4, size=8):
            damaged[position] ^= int(rng.integers(1, 256))
        path = tmp_path / f"damaged-{trial}.parquet"
        path.write_bytes(bytes(damaged))
        try:
            ids, values = read_submission(path)
        except SubmissionError as exc:
            assert str(exc).startswith(str(path))
            continue
        assert len(ids) == len(values) and np.isfinite(values).all()


def test_results_are_strict_json_and_names_are_escaped(tmp_path: Path) -> None:
    board = tmp_path / "board.json"
    add_result(board, "a|b <img src=x> [link](http://x)", "syn", "test",
               {"tau": 0.5, "r2": float("-inf"), "l1": 0.1, "tau@0.8": float("nan")}, "x")
    text = board.read_text()
    assert "NaN" not in text and "Infinity" not in text
    import json

    entry = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))["entries"][0]
    assert entry["metrics"]["r2"] is None and entry["metrics"]["tau@0.8"] is None
    row = next(line for line in render_leaderboard(load_leaderboard(board)).splitlines() if line.startswith("| 1 "))
    assert "a\\|b \\<img src=x\\> \\[link\\]\\(http://x\\)" in row and row.count(" | ") == 9  # the last cell is the run count


# The process's own high-water mark (VmHWM: ru_maxrss would carry the forking test process's over execve) and
# that of the Parquet child it spawns.
PEAK = ("import resource, sys\n"
        "from nfn_baselines.leaderboard.scoring import SubmissionError, read_submission\n"
        "try:\n    read_submission(sys.argv[1])\nexcept SubmissionError as exc:\n    print('refused:', exc)\n"
        "own = next(int(line.split()[1]) for line in open('/proc/self/status') if line.startswith('VmHWM:'))\n"
        "print('peak', max(own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))")


def _peak_mib(path: Path) -> tuple[float, str]:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", PEAK, str(path)], capture_output=True, text=True, timeout=600,
                         cwd=PROJECT, check=True).stdout
    return int(out.split("peak")[-1]) / 1024, out


@pytest.mark.slow
def test_the_scorer_stays_within_300_mb_for_any_input_within_its_limit(tmp_path: Path) -> None:
    """Blank lines up to the size limit, the most rows allowed, and a small Parquet file of dictionary-encoded
    values that decodes to gigabytes: each is read (or refused) in at most 300 MB, the Parquet child included."""
    from nfn_baselines.leaderboard import scoring as leaderboard

    blank = tmp_path / "blank.csv"
    with open(blank, "w") as handle:
        handle.write("checkpoint_id,predicted_accuracy\n")
        handle.write("\n" * (leaderboard.MAX_BYTES - 100))
    rows = tmp_path / "rows.csv"
    with open(rows, "w") as handle:
        handle.write("checkpoint_id,predicted_accuracy\n")
        for i in range(leaderboard.MAX_ROWS):
            handle.write(f"mnist-adam-{i:07d}-e012,0.5\n")
    bomb = tmp_path / "bomb.parquet"
    ids = pa.DictionaryArray.from_arrays(pa.array(np.zeros(50_000, dtype=np.int32)), pa.array(["x" * 100_000]))
    table = pa.table({"checkpoint_id": ids, "predicted_accuracy": pa.array(np.full(50_000, 0.5))})
    pq.write_table(table, bomb, compression="zstd")
    assert bomb.stat().st_size < 2_000_000
    for path in (blank, rows, bomb):
        peak, said = _peak_mib(path)
        assert peak <= 300, (path.name, peak, said)
    assert "decodes to more than" in _peak_mib(bomb)[1]
