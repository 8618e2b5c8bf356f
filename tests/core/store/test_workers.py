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
        _damage_first_row(weights)
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


def _damage_first_row(weights) -> None:
    source = weights.sources[0]
    with open(source.path, "r+b") as handle:  # one weight of the shard's first row, changed in place
        handle.seek(source.data_start)
        value = handle.read(1)
        handle.seek(source.data_start)
        handle.write(bytes([value[0] ^ 0x01]))


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_workers_error_reaches_the_caller_as_its_own_kind(zoo_copy: Path, start: str) -> None:
    """A shard damaged after `split_weights`: the caller of the DataLoader gets a `ZooDamagedError` (not torch's
    RuntimeError) whose message carries the worker's, the shard named."""
    from small_transformer_zoo import ZooDamagedError

    with Zoo.open(zoo_copy, "syn") as zoo:
        weights = zoo.split_weights("train")
        _damage_first_row(weights)
        loader = torch.utils.data.DataLoader(WeightSpaceDataset(weights), batch_size=4, num_workers=2,
                                             multiprocessing_context=start, collate_fn=WeightSpaceCollator(zoo.spec))
        with pytest.raises(ZooDamagedError, match=r"(?s)Caught ZooDamagedError in DataLoader worker.*"
                                                  r"changed after it was verified"):
            list(loader)


def test_a_zoo_replaced_before_the_workers_start_is_said_by_the_workers(zoo_copy: Path, tmp_path: Path) -> None:
    """Spawned workers open the files again; the files of the version opened are gone: a not-found error of the
    package reaches the caller, not "worker exited unexpectedly"."""
    import shutil

    from small_transformer_zoo import ZooNotFoundError

    with Zoo.open(zoo_copy, "syn") as zoo:
        weights = zoo.split_weights("train")
        shutil.move(str(zoo_copy), str(tmp_path / "moved"))
        loader = torch.utils.data.DataLoader(WeightSpaceDataset(weights), batch_size=4, num_workers=2,
                                             multiprocessing_context="spawn",
                                             collate_fn=WeightSpaceCollator(zoo.spec))
        with pytest.raises(ZooNotFoundError, match="cannot be opened again in this process"):
            list(loader)


def test_an_empty_split_pickles(tmp_path: Path) -> None:
    from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

    write_synthetic_zoo(tmp_path, "one", runs=1, register=False)
    with Zoo.open(tmp_path, "one") as zoo:
        empty = next(s for s in zoo.splits if not len(zoo.metadata(s)))
        weights = zoo.split_weights(empty)
        again = pickle.loads(pickle.dumps(WeightSpaceDataset(weights, label=None)))
        assert len(again) == 0 and again.weights.to_tensor().shape == (0, zoo.spec.n_params)
