"""Errors by kind: not found, bad argument, damaged data and Hub failure, each under the one base `ZooFormatError`
and under the matching built-in, raised by the read paths a user meets them on."""

from __future__ import annotations

import json
import pickle
import uuid
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from small_transformer_zoo import Zoo, ZooFormatError, load_dataset
from small_transformer_zoo.errors import (DataError, LabelsWithheldError, ZooArgumentError, ZooDamagedError,
                                          ZooHubError, ZooNotFoundError, ZooReplacedError)
from small_transformer_zoo.format.manifest import MANIFEST_NAME
from small_transformer_zoo.hub.opening import open_zoo
from small_transformer_zoo.testing import HubServer
from tests.helpers import shard_file

KINDS = (ZooNotFoundError, ZooArgumentError, ZooDamagedError, ZooHubError, ZooReplacedError, LabelsWithheldError)


def test_every_kind_is_a_zoo_error_and_a_data_error() -> None:
    for kind in KINDS:
        assert issubclass(kind, ZooFormatError) and issubclass(kind, DataError) and issubclass(kind, ValueError)
    assert issubclass(ZooNotFoundError, FileNotFoundError)
    assert issubclass(ZooReplacedError, ZooNotFoundError)
    others = [k for k in (ZooArgumentError, ZooDamagedError, ZooHubError)]
    assert not any(issubclass(a, b) for a in others for b in others if a is not b)
    assert not issubclass(ZooDamagedError, OSError) and not issubclass(ZooArgumentError, OSError)


@given(kind=st.sampled_from(KINDS), path=st.none() | st.text(min_size=1, max_size=40),
       problem=st.text(min_size=1, max_size=80))
def test_a_kind_crosses_a_process_boundary_intact(kind: type[ZooFormatError], path: str | None, problem: str) -> None:
    error = kind(path, problem)
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is kind and back.path == error.path and back.problem == problem and str(back) == str(error)
    assert str(error) == (f"{path}: {problem}" if path else problem)


def test_what_is_not_there_is_not_found(synthetic_root: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no such folder"):
        Zoo.open(tmp_path / "nowhere", "syn")
    with pytest.raises(ZooNotFoundError, match="has no config 'cifar'; its configs are \\['syn'\\]"):
        Zoo.open(synthetic_root, "cifar")
    with pytest.raises(ZooNotFoundError, match="unknown split 'trian'"):
        Zoo.open(synthetic_root, "syn").metadata("trian")
    with pytest.raises(ZooNotFoundError, match="unknown split 'trian'"):
        load_dataset(synthetic_root, "syn", split="trian")
    with pytest.raises(ZooNotFoundError, match="holds no zoo config"):
        load_dataset(tmp_path)


def test_an_argument_the_zoo_cannot_take_is_a_bad_argument(synthetic_root: Path) -> None:
    zoo = Zoo.open(synthetic_root, "syn")
    with pytest.raises(ZooArgumentError, match="is config 'syn', not 'other'"):
        open_zoo(zoo, "other")
    with pytest.raises(ZooArgumentError, match="the short name stands for one config"):
        load_dataset("small-transformer-zoo")
    with pytest.raises(ZooArgumentError, match="is the config folder of 'syn', not of 'other'"):
        load_dataset(synthetic_root / "syn", "other")


def test_a_damaged_file_is_damaged_not_missing(zoo_copy: Path) -> None:
    shard = shard_file(zoo_copy / "syn", "train")
    data = bytearray(shard.read_bytes())
    data[-5] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(ZooDamagedError, match=shard.name) as caught:
        Zoo.open(zoo_copy, "syn", verify="always").split_weights("train")
    assert not isinstance(caught.value, FileNotFoundError)
    manifest = zoo_copy / "syn" / MANIFEST_NAME
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "format_version": 99}))
    with pytest.raises(ZooDamagedError, match="field 'format_version' is 99"):
        Zoo.open(zoo_copy, "syn")


def test_a_missing_shard_is_not_found(zoo_copy: Path) -> None:
    shard = shard_file(zoo_copy / "syn", "test")
    shard.unlink()
    with pytest.raises(ZooNotFoundError, match=shard.name):
        Zoo.open(zoo_copy, "syn").split_weights("test")


def test_the_hub_says_not_found_apart_from_failing(hub: HubServer, synthetic_root: Path, tmp_path: Path,
                                                    stz_home: Path) -> None:
    repo_id = f"org/kinds-{uuid.uuid4().hex[:8]}"
    hub.add_dataset(repo_id, synthetic_root)
    with pytest.raises(ZooNotFoundError, match="unknown config 'cifar'"):
        load_dataset(repo_id, "cifar", split="test", cache_dir=str(tmp_path / "a"))
    with pytest.raises(ZooNotFoundError, match="org/none-such"):
        load_dataset("org/none-such", "syn", split="test", cache_dir=str(tmp_path / "b"))
    shard = str(shard_file(synthetic_root / "syn", "train").relative_to(synthetic_root))
    hub.fail_with[f"{repo_id}/{shard}"] = 500
    try:
        with pytest.raises(ZooHubError, match=repo_id) as caught:
            load_dataset(repo_id, "syn", split="train", cache_dir=str(tmp_path / "c"))
        assert not isinstance(caught.value, ZooNotFoundError)
    finally:
        hub.fail_with.clear()


def test_a_hub_that_fails_every_request_is_a_hub_error_not_a_missing_zoo(hub: HubServer, synthetic_root: Path,
                                                                          tmp_path: Path, stz_home: Path) -> None:
    repo_id = f"org/down-{uuid.uuid4().hex[:8]}"
    hub.add_dataset(repo_id, synthetic_root)
    hub.fail_everything = 500
    try:
        for read in (lambda: load_dataset(repo_id, "syn", split="train", cache_dir=str(tmp_path / "a")),
                     lambda: open_zoo(repo_id, "syn"), lambda: open_zoo(repo_id)):
            with pytest.raises(ZooHubError, match=repo_id) as caught:
                read()
            assert not isinstance(caught.value, ZooNotFoundError), caught.value
    finally:
        hub.fail_everything = None


def test_a_where_that_is_not_a_mapping_is_a_bad_argument(synthetic_root: Path) -> None:
    with pytest.raises(ValueError, match=r"where must map columns to conditions, e.g. \{'epoch': 1\}.*got a list"):
        load_dataset(synthetic_root, "syn", split="train", where=[("epoch", 1)])
    with pytest.raises(ValueError, match="where must map columns to conditions"):
        Zoo.open(synthetic_root, "syn").select("train", where=[("epoch", 1)])


def test_a_state_folder_that_is_a_file_is_refused_before_a_zoo_is_written(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

    home = tmp_path / "home-file"
    home.write_text("not a folder")
    monkeypatch.setenv("STZ_HOME", str(home))
    with pytest.raises(ZooArgumentError, match="home-file: the package's state folder .* is a file"):
        write_synthetic_zoo(tmp_path / "root", "syn", runs=4)
    assert not (tmp_path / "root" / "syn").exists(), "nothing written"
    with pytest.raises(ZooArgumentError, match="is a file"):
        load_dataset("small-transformer-zoo", "syn")
