from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from small_transformer_zoo import Zoo
from small_transformer_zoo.format.splits import SPLIT_NAMES, assign_split
from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo


@given(run_id=st.text(min_size=1, max_size=40), salt=st.text(max_size=10))
def test_assignment_depends_only_on_run_id_salt_and_fractions(run_id: str, salt: str) -> None:
    first = assign_split(run_id, salt=salt)
    assert first in SPLIT_NAMES
    assert assign_split(run_id, salt=salt) == first
    assert assign_split(run_id, {"train": 1.0}, salt=salt) == "train"


def test_default_fractions_are_close_to_70_15_15() -> None:
    counts = Counter(assign_split(f"run-{i}") for i in range(20_000))
    assert abs(counts["train"] / 20_000 - 0.70) < 0.015
    assert abs(counts["validation"] / 20_000 - 0.15) < 0.015
    assert abs(counts["test"] / 20_000 - 0.15) < 0.015


def test_configurable_fractions_are_checked() -> None:
    counts = Counter(assign_split(f"r{i}", {"train": 0.5, "validation": 0.0, "test": 0.5}) for i in range(4_000))
    assert counts["validation"] == 0 and abs(counts["train"] - 2_000) < 200
    for bad in ({"train": 0.7, "test": 0.2}, {"train": 1.1, "test": -0.1}):
        with pytest.raises(ValueError, match="split fractions must be non-negative and sum to 1"):
            assign_split("r", bad)
    with pytest.raises(ValueError, match="unknown split names"):
        assign_split("r", {"train": 0.5, "holdout": 0.5})


def test_no_run_occurs_in_two_splits_of_a_written_zoo(tmp_path: Path) -> None:
    write_synthetic_zoo(tmp_path, "z", runs=60, epochs=(1, 2, 3), shard_size=7, register=False)
    zoo = Zoo.open(tmp_path, "z")
    runs = {split: set(zoo.metadata(split).column("run_id").to_pylist()) for split in SPLIT_NAMES}
    assert all(runs.values())
    assert not (runs["train"] & runs["validation"]) and not (runs["train"] & runs["test"])
    assert not (runs["validation"] & runs["test"])
    assert sum(len(r) for r in runs.values()) == 60
    for split in SPLIT_NAMES:  # every checkpoint of a run sits in its run's split
        assert set(zoo.metadata(split).column("split").to_pylist()) == {split}
        assert all(assign_split(run, salt=zoo.manifest["splits"]["salt"]) == split for run in runs[split])


def test_splits_are_reproducible_across_builds(tmp_path: Path) -> None:
    a = write_synthetic_zoo(tmp_path / "a", "z", runs=30, register=False)
    b = write_synthetic_zoo(tmp_path / "b", "z", runs=30, register=False, shard_size=3)
    assert a["counts"] == b["counts"]
    ids = [Zoo.open(tmp_path / d, "z").metadata("test").column("checkpoint_id").to_pylist() for d in "ab"]
    assert ids[0] == ids[1]
