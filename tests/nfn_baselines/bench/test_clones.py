"""Near-clones across splits: the family split rule, the clone census and the `nearest_run` floor, on a zoo whose
families of runs (one setting, five L2 values) are near-copies of one another, as a shared-seed zoo's are."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nfn_baselines.bench.data import load_bench_data
from nfn_baselines.bench.benchmark import run_benchmark
from nfn_baselines.bench.request import BenchRequest
from nfn_baselines.models.predictors import get_predictor
from nfn_baselines.bench.report import score
from small_transformer_zoo import Zoo
from small_transformer_zoo.errors import ZooFormatError
from small_transformer_zoo.format.architecture import mnist_spec
from small_transformer_zoo.format.metadata import OPTIMIZERS
from small_transformer_zoo.format.splits import FAMILY_KEYS, SplitRule, assign_split
from small_transformer_zoo.store.census import census_report, format_census, nearest_distances
from small_transformer_zoo.store.writer import ZooWriter

SPEC = mnist_spec()
L2 = (1e-8, 1e-7, 1e-6, 1e-4, 1e-2)


def write_family_zoo(root: Path, split_by: str, families: int = 48, noise: float = 1e-4) -> Path:
    """`families` settings, each run at every L2 value; a family's runs are one weight vector plus `noise`
    (relative), its accuracy a random number of the family's (the weights say nothing else about it)."""
    rng = np.random.default_rng(0)
    with ZooWriter(root, "fam", SPEC, register=False, split_by=split_by) as writer:
        for f in range(families):
            base = rng.normal(0, 0.2, SPEC.n_params).astype(np.float32)
            accuracy = float(rng.uniform(0.1, 0.9))
            setting = {"optimizer": OPTIMIZERS[f % 4], "learning_rate": float(10 ** -(1 + f % 3)),
                       "dropout": 0.1 * (f % 2), "w_init_std": 0.2, "train_fraction": 1.0 - 0.1 * (f // 4 % 4)}
            for i, l2 in enumerate(L2):
                params = base * (1 + noise * rng.normal(size=SPEC.n_params)).astype(np.float32)
                for epoch in (1, 2):
                    writer.add(params * epoch, {"run_id": f"f{f:03d}-l2-{i}", "epoch": epoch, **setting, "l2": l2,
                                                "seed": 3, "test_accuracy": accuracy + 0.01 * i * epoch})
    return root


@pytest.fixture(scope="module")
def by_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_family_zoo(tmp_path_factory.mktemp("run"), "run")


@pytest.fixture(scope="module")
def by_family(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_family_zoo(tmp_path_factory.mktemp("family"), "family")


hyper = st.fixed_dictionaries({"run_id": st.text(min_size=1, max_size=12),
                               "optimizer": st.sampled_from(OPTIMIZERS),
                               **{k: st.floats(1e-9, 1.0) for k in FAMILY_KEYS if k != "optimizer"}})


@settings(max_examples=60, deadline=None)
@given(row=hyper, other=hyper, salt=st.text(max_size=8))
def test_family_rule_puts_runs_that_differ_only_in_l2_and_init_std_together(row: dict, other: dict,
                                                                             salt: str) -> None:
    rule = SplitRule("family", salt=salt)
    twin = {**row, "run_id": other["run_id"], "l2": other["l2"], "w_init_std": other["w_init_std"]}
    assert rule.assign(row) == rule.assign(twin)
    assert SplitRule.from_manifest(rule.to_manifest()) == rule
    assert SplitRule("run", salt=salt).assign(row) == assign_split(row["run_id"], salt=salt)


def test_family_split_zoo_keeps_families_whole_and_is_verified(by_family: Path, by_run: Path) -> None:
    zoo = Zoo.open(by_family, "fam")
    assert zoo.manifest["splits"]["by"] == "family" and zoo.summary()["split_rule"].startswith("by family")
    family_splits: dict[str, set[str]] = {}
    for split in zoo.splits:
        for run in zoo.metadata(split).column("run_id").to_pylist():
            family_splits.setdefault(run.split("-")[0], set()).add(split)
    assert all(len(s) == 1 for s in family_splits.values())
    assert zoo.verify() == []
    straddling = {run.split("-")[0] for split in ("train", "test")
                  for run in Zoo.open(by_run, "fam").metadata(split).column("run_id").to_pylist()}
    assert len(straddling) < 2 * 48, "split by run, some families lie on both sides"
    manifest_path = by_family / "fam" / "zoo.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["splits"] = {k: v for k, v in manifest["splits"].items() if k != "varies"} | {"by": "run_id"}
    broken = by_family.parent / "relabelled"
    import shutil

    shutil.copytree(by_family, broken)
    (broken / "fam" / "zoo.json").write_text(json.dumps(manifest))
    with pytest.raises(ZooFormatError, match="belongs to split"):
        for split in ("train", "validation", "test"):
            Zoo.open(broken, "fam").metadata(split)


def test_census_finds_the_clones_a_run_split_leaks_and_a_family_split_does_not(by_run: Path,
                                                                              by_family: Path) -> None:
    leaky = census_report(Zoo.open(by_run, "fam"), epoch=2, canonical=False)
    clean = census_report(Zoo.open(by_family, "fam"), epoch=2, canonical=False)
    assert leaky["seed_policy"] == "shared" and leaky["epoch"] == 2
    assert leaky["splits"]["test"]["raw"]["within"] > 0.9
    assert leaky["splits"]["train"]["raw"]["within"] > 0.9, "most families have several training runs"
    assert clean["splits"]["test"]["raw"]["within"] == 0.0
    assert clean["splits"]["test"]["raw"]["quantiles"]["0.5"] > 1.0, "unrelated runs are far apart"
    words = format_census(clean)
    assert "no test run has a training run within 0.01" in words and "as far as unrelated networks are" in words
    assert "no test run" not in format_census(leaky)
    assert 0 < leaky["splits"]["test"]["raw"]["quantiles"]["0.05"] < 1e-3


@settings(max_examples=20, deadline=None)
@given(queries=st.integers(1, 6), references=st.integers(2, 9), seed=st.integers(0, 1000))
def test_nearest_distances_match_brute_force(queries: int, references: int, seed: int) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    reference = torch.randn(references, 50, generator=g)
    query = torch.cat([reference[:1] * (1 + 1e-5), torch.randn(queries, 50, generator=g)])
    unit = lambda rows: rows.double() / rows.double().norm(dim=1, keepdim=True)  # noqa: E731
    exact = torch.cdist(unit(query), unit(reference)).min(1).values
    assert np.allclose(nearest_distances(query, reference), exact.numpy(), rtol=1e-9, atol=1e-12)
    assert nearest_distances(query[:1], reference)[0] < 1e-6, "a scaled copy points the same way (float32 rounding)"
    self_exact = torch.cdist(unit(reference), unit(reference)).fill_diagonal_(np.inf).min(1).values
    assert np.allclose(nearest_distances(reference, reference, exclude_self=True), self_exact.numpy(), rtol=1e-9)


def test_unrelated_networks_lie_near_sqrt_2_whatever_their_norms() -> None:
    """Relative distance called every unrelated network's nearest a collapsed one at 1.000; directions do not."""
    import torch

    g = torch.Generator().manual_seed(3)
    reference = torch.cat([torch.randn(50, 2000, generator=g) * 0.5, torch.randn(3, 2000, generator=g) * 1e-3])
    distances = nearest_distances(torch.randn(40, 2000, generator=g), reference)
    assert np.all((distances > 1.3) & (distances < 1.45)), distances


def test_nearest_run_floor_memorises_leaked_clones_only(by_run: Path, by_family: Path) -> None:
    assert get_predictor("nearest_run").kind == "floor"
    taus = {}
    for name, root in (("run", by_run), ("family", by_family)):
        data = load_bench_data(root, "fam", protocol="paper", epoch=2)
        result = run_benchmark(data, BenchRequest(models=["nearest_run"], seeds=1, epochs=1, thresholds=()))
        taus[name] = score(result, ()).cells["nearest_run"]["tau"].estimate
    assert taus["run"] > 0.8
    assert taus["family"] < 0.5


def test_bench_resplits_by_family(by_run: Path) -> None:
    data = load_bench_data(by_run, "fam", protocol="paper", epoch=2, split_by="family")
    assert data.split_rule.by == "family" and data.describe()["split_rule"]["by"] == "family"
    sides = {}
    for split, part in data.splits.items():
        for run in part.runs.tolist():
            sides.setdefault(run.split("-")[0], set()).add(split)
    assert all(len(s) == 1 for s in sides.values())


@pytest.mark.slow
def test_info_clones_prints_the_census(by_run: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "small_transformer_zoo.cli", "info", str(by_run), "--clones",
                          "--clone-epoch", "2"], capture_output=True, text=True, check=True).stdout
    assert "seeds: shared; splits by run" in out
    assert "near-clones of fam at epoch 2" in out and "canonical" in out
    test_line = next(line for line in out.splitlines() if line.split()[:1] == ["test"] and "raw" in line)
    assert float(test_line.split()[3].rstrip("%")) > 90
