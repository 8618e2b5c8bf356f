"""A split's weights cross into worker processes by path and file version: DataLoader workers started by spawn or
forkserver map the shards again, and a shard that changed after it was verified is checked row by row there."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from small_transformer_zoo import WeightSpaceCollator, WeightSpaceDataset, Zoo, ZooFormatError


@pytest.mark.parametrize("start", ["spawn", "forkserver"])
def test_dataloader_workers_started_afresh_read_the_same_rows(synthetic_root: Path, start: str) -> None:
    with Zoo.open(synthetic_root, "syn") as zoo:
        weights = zoo.split_weights("train")
        data = WeightSpaceDataset(weights)
        loader = torch.utils.data.DataLoader(data, batch_size=7, num_workers=2, multiprocessing_context=start,
                                             collate_fn=WeightSpaceCollator(zoo.spec))
        got = torch.cat([batch.labels for batch in loader])
        assert torch.equal(got, weights.labels())
        expected = weights.to_tensor()
        rows = [data[i]["params"] for i in range(len(data))]
        assert torch.equal(torch.stack(rows), expected)


def test_a_pickle_holds_paths_not_bytes(synthetic_root: Path) -> None:
    with Zoo.open(synthetic_root, "syn") as zoo:
        weights = zoo.split_weights("train")
        raw = pickle.dumps(weights)
        shard_bytes = sum(s.numel() * 4 for s in weights.shards)
        assert len(raw) < shard_bytes / 4, "the mapped matrices are not copied into the pickle"
        again = pickle.loads(raw)
        assert torch.equal(again.to_tensor(), weights.to_tensor())
        assert again.watch is not None and not again.watch.changed()


def test_a_shard_changed_after_pickling_is_caught_in_the_worker(zoo_copy: Path) -> None:
    with Zoo.open(zoo_copy, "syn") as zoo:
        weights = zoo.split_weights("train")
        raw = pickle.dumps(WeightSpaceDataset(weights))
        source = weights.sources[0]
        with open(source.path, "r+b") as handle:  # one weight of the shard's first row, changed in place
            handle.seek(source.data_start)
            value = handle.read(1)
            handle.seek(source.data_start)
            handle.write(bytes([value[0] ^ 0x01]))
        again = pickle.loads(raw)
        assert again.weights.watch.changed()
        first = int(torch.nonzero(torch.from_numpy(again.weights.global_rows) == 0)[0])
        with pytest.raises(ZooFormatError, match="changed after it was verified"):
            again[first]


def test_a_split_opened_without_checks_pickles_too(synthetic_root: Path) -> None:
    with Zoo.open(synthetic_root, "syn", verify="never") as zoo:
        weights = zoo.split_weights("train")
        again = pickle.loads(pickle.dumps(weights))
        assert again.watch is None and torch.equal(again.to_tensor(), weights.to_tensor())
