"""One rule for what a figure may rest on, in every output: `stz bench`, `stz score` and the leaderboards show a
figure resting on fewer than `MIN_RUNS` test runs as "too few runs (n)", and a difference with no interval is
"n/a", never "tied"."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from nfn_baselines.bench.runs import BenchRequest, run_bench
from nfn_baselines.bench.submission import write_submission
from nfn_baselines.leaderboard.scoring import add_result, load_leaderboard, render_leaderboard, score_submission
from nfn_baselines.models.metrics import MIN_RUNS, paired_difference, too_few_runs
from small_transformer_zoo import Zoo
from small_transformer_zoo.cli import main
from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

THRESHOLDS = (0.2, 0.4, 0.6, 0.8)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Zoo:
    """Enough test runs for tau on all checkpoints, too few above the high thresholds."""
    root = tmp_path_factory.mktemp("runs")
    write_synthetic_zoo(root, "syn", runs=90, register=False)
    return Zoo.open(root, "syn")


def _submission(zoo: Zoo, folder: Path) -> Path:
    meta = zoo.metadata("test")
    true = np.asarray(meta.column("test_accuracy").to_pylist())
    predicted = np.clip(true + np.random.default_rng(0).normal(0, 0.1, len(true)), 0, 1)
    return write_submission(folder / "sub.csv", meta.column("checkpoint_id").to_pylist(), predicted)


def test_bench_and_score_agree_on_the_runs_behind_each_figure(zoo: Zoo, tmp_path: Path) -> None:
    metrics = score_submission(_submission(zoo, tmp_path), zoo, "syn", "test", THRESHOLDS)
    outcome = run_bench(zoo, BenchRequest(models=["l2_norm"], seeds=1, thresholds=THRESHOLDS, device="cpu"),
                        tmp_path / "bench")
    cells = outcome.report.cells["l2_norm"]
    for column in ["tau", *(f"tau@{t:g}" for t in THRESHOLDS)]:
        assert metrics["column_runs"][column] == cells[column].runs, column
    flags = {c: too_few_runs(metrics["column_runs"][c]) for c in metrics["column_runs"]}
    assert not flags["tau"] and flags["tau@0.8"], metrics["column_runs"]
    assert "Not shown, resting on fewer than 10 test runs: tau (acc >= 0.8)" in outcome.markdown


def test_stz_score_shows_too_few_runs_instead_of_a_figure(zoo: Zoo, tmp_path: Path, capsys) -> None:
    submission = _submission(zoo, tmp_path)
    assert main(["score", str(submission), "--zoo", str(zoo.dir)]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[0]: line for line in out.splitlines()[1:] if line.strip()}
    assert "too few runs" in lines["tau@0.8"] and f"a figure needs {MIN_RUNS}" in lines["tau@0.8"]
    assert "too few runs" not in lines["tau"] and "[" in lines["tau"]
    assert str(zoo.dir) in out.splitlines()[0], "the zoo's path is named"


def test_the_leaderboard_shows_the_rule_and_ranks_only_entries_with_enough_runs(zoo: Zoo, tmp_path: Path) -> None:
    board = tmp_path / "results.json"
    metrics = score_submission(_submission(zoo, tmp_path), zoo, "syn", "test", THRESHOLDS)
    add_result(board, "enough", "syn", "test", metrics, "sub.csv")
    few = dict(metrics, tau=0.99, column_runs=dict(metrics["column_runs"], tau=MIN_RUNS - 1))
    add_result(board, "few", "syn", "test", few, "sub.csv")
    table = render_leaderboard(load_leaderboard(board), THRESHOLDS)
    rows = [line for line in table.splitlines() if line.startswith("| ") and "rank" not in line]
    assert rows[0].startswith("| 1 | enough |") and rows[1].startswith("| - | few | too few runs (9) |")
    header = next(line for line in table.splitlines() if line.startswith("| rank"))
    column = [c.strip() for c in header.split("|")].index("tau >= 0.8")
    assert all("too few runs" in row.split("|")[column] for row in rows)


def test_a_difference_without_an_interval_is_neither_tied_nor_apart() -> None:
    undefined = paired_difference(np.full(1000, np.nan), np.zeros(1000), 0.4, 0.5)
    assert not undefined["tied"] and not undefined["decided"]
    holds_zero = paired_difference(np.random.default_rng(0).normal(0, 1, 1000), np.zeros(1000), 0.1, 0.0)
    assert holds_zero["tied"] and holds_zero["decided"]
