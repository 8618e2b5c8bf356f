"""Paired differences in every tau column of a finished benchmark run, read back from its stored fits."""

import json
from pathlib import Path

import pytest

from tests.helpers import benchmark_script


@pytest.fixture(scope="module")
def differences():
    return benchmark_script("bench_differences")


def test_a_finished_runs_pairs_in_every_column_agree_with_its_own_table(differences, tmp_path: Path) -> None:
    from nfn_baselines.bench.request import BenchRequest
    from nfn_baselines.bench.runs import run_bench
    from small_transformer_zoo import Zoo
    from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

    write_synthetic_zoo(tmp_path / "zoos", "synth", runs=80, register=False)
    zoo = Zoo.open(tmp_path / "zoos", "synth")
    out = tmp_path / "run"
    with pytest.raises(FileNotFoundError, match="finished `stz bench` run"):
        differences.column_differences(zoo, out, [("statnn", "hyperparameters")])
    out.mkdir()
    request = BenchRequest(models=["statnn"], floors=True, seeds=1, protocol="paper", epoch=10, thresholds=(0.3,))
    run_bench(zoo, request, out)
    fits = sorted(p.stat().st_mtime_ns for p in out.rglob("*.npz"))
    lines = differences.column_differences(zoo, out, [("statnn", "l2_norm"), ("statnn", "hyperparameters")])
    assert [line.split(",")[1].split(" (")[0].strip() for line in lines] == ["tau", "tau@0.3"] * 2
    assert all(line.endswith("n/a (no tau for one of them: constant predictions)") for line in lines[2:])
    table = json.loads(next(out.glob("synth-bench*.json")).read_text())
    main = table["models"]["statnn"]["differences"]["l2_norm"]
    runs = table["models"]["statnn"]["columns"]["tau"]["runs"]
    assert lines[0].startswith(f"statnn minus l2_norm, tau ({runs} test runs): {main['estimate']:+.3f} "
                               f"[{main['low']:+.3f}, {main['high']:+.3f}]")
    assert sorted(p.stat().st_mtime_ns for p in out.rglob("*.npz")) == fits, "the run's own folder is left as it was"
    with pytest.raises(ValueError, match="no model 'probegen'"):
        differences.column_differences(zoo, out, [("probegen", "statnn")])
