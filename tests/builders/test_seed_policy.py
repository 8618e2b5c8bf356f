"""`--seed-policy`: per-run seeds make independent runs; `shared` reproduces the original release's one seed for
every run, with the consequences that make near-clones: one initial draw scaled by each run's init std, one
training subset per train fraction, one batch order and one set of dropout masks."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from builders.grid import PRESETS, SHARED_SEED, Run, full_grid, preset_runs, run_seed
from builders.trainer import GroupDropout, RunStreams
from small_transformer_zoo import Zoo
from small_transformer_zoo.format.architecture import mnist_spec
from tests.helpers import build_zoo

SPEC = mnist_spec()
N_TRAIN = 500


def pair(policy: str, differing: str) -> tuple[Run, Run]:
    """Two runs of the grid that differ only in `differing` (l2 or w_init_std)."""
    runs = full_grid("mnist", policy)
    by_key = {}
    for run in runs:
        key = (run.optimizer, *(v for k, v in run.hyperparameters().items() if k not in (differing, "seed")))
        if key in by_key:
            return by_key[key], run
        by_key[key] = run
    raise AssertionError("the grid has no such pair")


@pytest.mark.parametrize("policy", ["shared", "per-run"])
def test_runs_that_differ_only_in_l2_start_identical_under_shared_seeds_only(policy: str) -> None:
    a, b = pair(policy, "l2")
    assert a.l2 != b.l2
    streams = RunStreams([a, b], SPEC, N_TRAIN)
    identical = torch.equal(streams.initial[0], streams.initial[1])
    same_subset = torch.equal(streams.subsets[0], streams.subsets[1])
    first, second = (RunStreams([run], SPEC, N_TRAIN).epoch(16, crop=True, dropout_seeds=True) for run in (a, b))
    same_order = torch.equal(first.order, second.order) and torch.equal(first.offsets, second.offsets)
    if policy == "shared":
        assert a.seed == b.seed == SHARED_SEED
        assert identical and same_subset and same_order
    else:
        assert a.seed != b.seed
        assert not identical and not same_subset and not same_order


@pytest.mark.parametrize("policy", ["shared", "per-run"])
def test_runs_that_differ_only_in_init_std_start_proportional_under_shared_seeds_only(policy: str) -> None:
    a, b = pair(policy, "w_init_std")
    initial = RunStreams([a, b], SPEC, N_TRAIN).initial
    ratio = b.w_init_std / a.w_init_std
    weights = torch.cat([torch.arange(p.offset, p.offset + p.numel) for p in SPEC.parameters()
                         if not p.name.endswith(".bias")])
    proportional = torch.allclose(initial[1, weights], ratio * initial[0, weights], rtol=1e-5, atol=1e-7)
    assert proportional == (policy == "shared")
    assert initial[0, weights].abs().max() > 0


@pytest.mark.parametrize("policy", ["shared", "per-run"])
def test_runs_share_dropout_masks_under_shared_seeds_only(policy: str) -> None:
    a, b = pair(policy, "l2")
    streams = RunStreams([a, b], SPEC, N_TRAIN)
    dropout = GroupDropout([0.1, 0.1], streams.generators, sites=3)
    dropout.draw((4, 8))
    assert torch.equal(dropout.keep[0], dropout.keep[1]) == (policy == "shared")


def test_seed_policy_is_part_of_the_plan_and_every_preset_keeps_its_runs() -> None:
    shared = preset_runs("mnist", PRESETS["families"], "shared")
    independent = preset_runs("mnist", PRESETS["families"])
    assert [replace(r, seed=0) for r in shared] == [replace(r, seed=0) for r in independent]
    assert {r.seed for r in shared} == {SHARED_SEED}
    assert len({r.seed for r in independent}) == len(independent) == 480
    assert all(r.seed == run_seed(r.run_id) for r in independent)
    with pytest.raises(ValueError, match="unknown seed policy"):
        run_seed("x", "one")


def test_families_preset_holds_every_l2_for_each_setting() -> None:
    runs = preset_runs("mnist", PRESETS["families"])
    families: dict[tuple, set[float]] = {}
    for run in runs:
        setting = (run.optimizer, run.train_fraction, run.dropout, run.learning_rate, run.w_init_std)
        families.setdefault(setting, set()).add(run.l2)
    assert len(runs) == 480 and len(families) == 96
    assert all(l2s == {1e-8, 1e-7, 1e-6, 1e-4, 1e-2} for l2s in families.values())
    for name in ("train_fraction", "dropout", "learning_rate", "w_init_std"):
        for optimizer in ("sgd", "adam"):
            values = [getattr(r, name) for r in runs if r.optimizer == optimizer]
            counts = [values.count(v) for v in set(values)]
            assert max(counts) - min(counts) <= 5, f"{name} is not balanced for {optimizer}"


@pytest.mark.slow
def test_a_shared_seed_build_repeated_is_byte_identical(tmp_path: Path) -> None:
    manifests = []
    for name in ("first", "second"):
        build_zoo("mnist", "tiny", tmp_path / name, seed_policy="shared")
        zoo = Zoo.open(tmp_path / name, "mnist-tiny-shared-seed")
        manifests.append(zoo.manifest)
        assert zoo.manifest["provenance"]["seed_policy"] == "shared"
        assert set(zoo.metadata("train").column("seed").to_pylist()) == {SHARED_SEED}
    files = [sorted((f["path"], f["sha256"]) for f in m["shards"]) for m in manifests]
    assert files[0] == files[1]
    assert [m["metadata"] for m in manifests][0] == [m["metadata"] for m in manifests][1]
    info = subprocess.run([sys.executable, "-m", "small_transformer_zoo.cli", "info", str(tmp_path / "first"),
                           "--json"], capture_output=True, text=True, check=True).stdout
    assert json.loads(info)["seed_policy"] == "shared"


def test_build_help_shows_the_seed_policy() -> None:
    out = subprocess.run([sys.executable, "-m", "small_transformer_zoo.cli", "build", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "--seed-policy {per-run,shared}" in out and "--split-by {run,family}" in out
    bench = subprocess.run([sys.executable, "-m", "small_transformer_zoo.cli", "bench", "--help"],
                           capture_output=True, text=True, check=True).stdout
    assert "--randomize {paper-group,interfaces,all}" in bench and "--split-by {run,family}" in bench
