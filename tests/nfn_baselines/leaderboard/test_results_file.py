"""A leaderboard's local results file: written through a symbolic link, never over a folder, never read from a
FIFO, and a file that is not strict JSON of well-formed entries is one clear error, never a traceback."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nfn_baselines.leaderboard.scoring import (SubmissionError, add_result, load_leaderboard, render_leaderboard,
                                               results_bytes)
from small_transformer_zoo.cli import main

METRICS = {"tau": 0.5, "n": 30, "runs": 12, "intervals": {"tau": [0.3, 0.7]}, "column_runs": {"tau": 12},
           "target": "test_accuracy"}


def test_a_symlinked_results_file_is_written_through_to_its_target(tmp_path: Path) -> None:
    target = tmp_path / "shared" / "results.json"
    target.parent.mkdir()
    link = tmp_path / "results.json"
    link.symlink_to(target)
    add_result(link, "a", "syn", "test", METRICS, "a.csv")
    add_result(link, "b", "syn", "test", METRICS, "b.csv")
    assert link.is_symlink() and link.resolve() == target
    assert [e["name"] for e in load_leaderboard(target)] == ["a", "b"]


def test_a_folder_given_as_the_results_file_is_refused_and_leaves_nothing(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "board"
    folder.mkdir()
    with pytest.raises(SubmissionError, match="a folder; a leaderboard's results are one JSON file"):
        add_result(folder, "a", "syn", "test", METRICS, "a.csv")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["board"], "no lock file beside it"
    assert main(["bench", str(tmp_path / "no-zoo"), "--leaderboard", str(folder)]) == 1
    assert "a folder; a leaderboard's results are one JSON file" in capsys.readouterr().err


def test_a_fifo_in_place_of_the_results_file_does_not_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "results.json"
    os.mkfifo(fifo)
    started = time.perf_counter()
    with pytest.raises(SubmissionError, match="is not a regular file"):
        load_leaderboard(fifo)
    assert time.perf_counter() - started < 5


@pytest.mark.parametrize("text, message", [
    ('{"entries": [{"name": "a", "config": "c", "split": "test", "metrics": {"tau": NaN}}]}', "NaN is not strict JSON"),
    ('{"entries": [{"name": "a", "config": "c", "split": "test", "metrics": {"tau": "high"}}]}',
     "entry 0: metric 'tau' is 'high', not a number"),
    ('{"entries": [{"name": "a", "config": "c", "split": "test", "metrics": {"intervals": [1, 2]}}]}',
     "entry 0: 'intervals' is a list, not a dict"),
    ('{"entries": [{"name": 5, "config": "c", "split": "test", "metrics": {}}]}', "entry 0: 'name' is 5, not text"),
    ('{"entries": [["a"]]}', "entry 0: a JSON list, not an object"),
    ('{"entries": [{"name": "a", "config": "c", "split": "t", "metrics": {"intervals": {"tau": [0.1]}}}]}',
     "the interval of 'tau' is"),
])
def test_a_malformed_results_file_is_one_clear_error(tmp_path: Path, text: str, message: str, capsys) -> None:
    path = tmp_path / "results.json"
    path.write_text(text)
    with pytest.raises(SubmissionError, match=message):
        load_leaderboard(path)
    assert main(["leaderboard", str(path)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(path) in err


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                                        max_size=3), max_leaves=12)
entries = st.lists(st.fixed_dictionaries({"name": json_values, "config": json_values, "split": json_values,
                                          "metrics": st.dictionaries(st.sampled_from(
                                              ["tau", "tau@0.4", "r2", "intervals", "runs", "column_runs",
                                               "main_resamples", "bootstrap", "target", "selection"]),
                                              json_values, max_size=5)}), max_size=3)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(drawn=entries)
def test_any_entry_renders_or_is_refused_clearly(tmp_path: Path, drawn: list) -> None:
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"format": "stz-leaderboard", "version": 1, "entries": drawn}))
    try:
        loaded = load_leaderboard(path)
    except SubmissionError:
        return
    render_leaderboard(loaded)
    assert results_bytes(loaded)
