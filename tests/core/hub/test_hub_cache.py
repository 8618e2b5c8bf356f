"""A Hugging Face cache holding several damaged files of a config recovers in one retry: the first failure
evicts every damaged file of the config, not only the one it met."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import torch

from small_transformer_zoo import Zoo, ZooFormatError, load_dataset, open_zoo
from small_transformer_zoo.testing import HubServer
from tests.helpers import shard_file


def _serve_with_damaged_shards(hub: HubServer, root: Path, count: int) -> str:
    repo_id = f"org/many-damaged-{uuid.uuid4().hex[:8]}"
    hub.add_dataset(repo_id, root)
    for index in range(count):
        hub.corrupt_once.add(f"{repo_id}/{shard_file(root / 'syn', 'train', index).relative_to(root)}")
    return repo_id


def test_one_retry_of_load_dataset_is_enough(hub: HubServer, synthetic_root: Path, stz_home: Path,
                                             tmp_path: Path) -> None:
    repo_id = _serve_with_damaged_shards(hub, synthetic_root, 3)
    cache = str(tmp_path / "datasets-cache")
    with pytest.raises(ZooFormatError, match=r"and 2 more damaged files of 'syn'.*next load downloads"):
        load_dataset(repo_id, "syn", split="train", cache_dir=cache)
    loaded = load_dataset(repo_id, "syn", split="train", cache_dir=cache).with_format("torch")
    assert torch.equal(loaded[:]["params"], Zoo.open(synthetic_root, "syn").split_weights("train").to_tensor())


def test_one_retry_of_open_zoo_is_enough(hub: HubServer, synthetic_root: Path, stz_home: Path) -> None:
    repo_id = _serve_with_damaged_shards(hub, synthetic_root, 2)
    with pytest.raises(ZooFormatError, match=r"and 1 more damaged files of 'syn'.*next open downloads"):
        open_zoo(repo_id, "syn").split_weights("train")
    expected = Zoo.open(synthetic_root, "syn").split_weights("train").to_tensor()
    assert torch.equal(open_zoo(repo_id, "syn").split_weights("train").to_tensor(), expected)
