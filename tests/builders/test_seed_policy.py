"""`--seed-policy` and `--shared-seed`: per-run seeds make independent runs; `shared` reproduces the original
release's one seed for every run, with the consequences that make near-clones: one initial draw made with each
run's init std, one training subset per train fraction, one batch order and one set of dropout masks;
`shared-init` and `shared-data` share one of those streams each."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from builders.grid import (DEFAULT_SHARED_SEED, PRESETS, SEED_POLICIES, SHARED_STREAMS, STREAMS, Run, full_grid,
                          preset_runs, run_seed)
from builders.trainer import RECIPE_VERSION, GroupDropout, RunStreams
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


def shares(a: Run, b: Run) -> dict[str, bool]:
    """Which of the three streams two runs share: the initial draw, the data (subset, two epochs of batch order
    and crops) and the dropout masks (CPU masks over two steps and the hashed masks' per-step seeds)."""
    both = RunStreams([a, b], SPEC, N_TRAIN)
    epochs = [both.epoch(16, crop=True, dropout_seeds=True) for _ in range(2)]
    data = torch.equal(both.subsets[0], both.subsets[1]) and all(
        torch.equal(e.order[0], e.order[1]) and torch.equal(e.offsets[0], e.offsets[1]) for e in epochs)
    dropout = GroupDropout([0.1, 0.1], RunStreams([a, b], SPEC, N_TRAIN).dropout, sites=3)
    masks = []
    for _ in range(2):
        dropout.draw((4, 8))
        masks.append(torch.equal(dropout.keep[0], dropout.keep[1]))
    hashed = all(torch.equal(e.dropout_seeds[0], e.dropout_seeds[1]) for e in epochs)
    assert all(masks) == hashed
    return {"init": torch.equal(both.initial[0], both.initial[1]), "data": data, "dropout": hashed}


@pytest.mark.parametrize("policy", SEED_POLICIES)
def test_each_policy_shares_exactly_its_streams(policy: str) -> None:
    """Runs that differ only in L2 share the streams the policy names and no other."""
    a, b = pair(policy, "l2")
    assert a.l2 != b.l2 and a.dropout == b.dropout > 0 and a.train_fraction == b.train_fraction
    expected = {stream: stream in SHARED_STREAMS[policy] for stream in STREAMS}
    assert shares(a, b) == expected
    seeds = [run.stream_seeds() for run in (a, b)]
    assert {s: seeds[0][s] == seeds[1][s] for s in STREAMS} == expected
    assert all(seeds[0][s] == DEFAULT_SHARED_SEED for s in SHARED_STREAMS[policy])


@pytest.mark.parametrize("policy", ["shared", "shared-init", "shared-data"])
def test_the_shared_seed_is_chosen(policy: str) -> None:
    """Another shared seed moves every shared stream and leaves the runs' own streams as they were."""
    runs = {seed: full_grid("mnist", policy, seed)[:2] for seed in (DEFAULT_SHARED_SEED, 7)}
    for stream in STREAMS:
        moved = [a.stream_seeds()[stream] != b.stream_seeds()[stream] for a, b in zip(runs[3], runs[7])]
        assert all(moved) == (stream in SHARED_STREAMS[policy]) and (any(moved) == all(moved))
    assert {r.stream_seeds()[s] for r in runs[7] for s in SHARED_STREAMS[policy]} == {7}


@pytest.mark.parametrize("policy", ["shared", "shared-init", "per-run"])
def test_runs_that_differ_only_in_init_std_start_from_one_draw_where_init_is_shared(policy: str) -> None:
    """One shared initial draw, made with each run's init std: the weights are nearly proportional (the
    truncation bounds of +-2 map the draw a little differently per std)."""
    a, b = pair(policy, "w_init_std")
    initial = RunStreams([a, b], SPEC, N_TRAIN).initial
    weights = torch.cat([torch.arange(p.offset, p.offset + p.numel) for p in SPEC.parameters()
                         if not p.name.endswith(".bias")])
    correlation = torch.corrcoef(torch.stack([initial[0, weights], initial[1, weights]]))[0, 1]
    ratio = (initial[1, weights].std() / initial[0, weights].std()).item()
    if policy == "per-run":
        assert abs(float(correlation)) < 0.05
    else:
        assert float(correlation) > 0.9999 and ratio == pytest.approx(b.w_init_std / a.w_init_std, rel=1e-3)


def test_seed_policy_is_part_of_the_plan_and_every_preset_keeps_its_runs() -> None:
    shared = preset_runs("mnist", PRESETS["families"], "shared")
    independent = preset_runs("mnist", PRESETS["families"])
    for policy in SEED_POLICIES:
        runs = preset_runs("mnist", PRESETS["families"], policy)
        assert [replace(r, seed=0, data_seed=None, dropout_seed=None) for r in runs] == \
            [replace(r, seed=0) for r in independent]
    assert {r.seed for r in shared} == {DEFAULT_SHARED_SEED}
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
        assert set(zoo.metadata("train").column("seed").to_pylist()) == {DEFAULT_SHARED_SEED}
    files = [sorted((f["path"], f["sha256"]) for f in m["shards"]) for m in manifests]
    assert files[0] == files[1]
    assert [m["metadata"] for m in manifests][0] == [m["metadata"] for m in manifests][1]
    info = subprocess.run([sys.executable, "-m", "small_transformer_zoo.cli", "info", str(tmp_path / "first"),
                           "--json"], capture_output=True, text=True, check=True).stdout
    assert json.loads(info)["seed_policy"] == "shared (seed 3)"
    assert json.loads(info)["recipe"].startswith(f"version {RECIPE_VERSION}:")


def test_build_help_shows_the_seed_policy() -> None:
    out = subprocess.run([sys.executable, "-m", "small_transformer_zoo.cli", "build", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "--seed-policy {per-run,shared,shared-init,shared-data}" in out and "--split-by {run,family}" in out
    assert "--shared-seed SHARED_SEED" in out
    bench = subprocess.run([sys.executable, "-m", "small_transformer_zoo.cli", "bench", "--help"],
                           capture_output=True, text=True, check=True).stdout
    assert "--randomize {paper-group,interfaces,all}" in bench and "--split-by {run,family}" in bench
