"""Selection by metadata (`where=`): the fast path and `load_dataset` (prepared and streaming) pick the same
checkpoints as a plain filter of the metadata rows, and read only the selected rows' bytes."""

import io
from pathlib import Path

import numpy as np
import pytest
import torch

from small_transformer_zoo import Zoo, load_dataset
from small_transformer_zoo.hub.hf_builder import read_row_runs
from small_transformer_zoo.format.shards import open_header

WHERES = [
    ({"optimizer": "adam"}, lambda r: r["optimizer"] == "adam"),
    ({"learning_rate": (1e-3, 1e-2), "epoch": [1, 10]},
     lambda r: 1e-3 <= r["learning_rate"] <= 1e-2 and r["epoch"] in (1, 10)),
    ({"test_accuracy": (0.5, None), "is_best": False}, lambda r: r["test_accuracy"] >= 0.5 and not r["is_best"]),
    ({"train_loss": None, "epoch": 1}, lambda r: r["train_loss"] is None and r["epoch"] == 1),
    ({"optimizer": {"sgd", "rmsprop"}, "dropout": (None, 0.1)},
     lambda r: r["optimizer"] in ("sgd", "rmsprop") and r["dropout"] <= 0.1),
]


@pytest.mark.parametrize("case", range(len(WHERES)))
def test_every_read_path_selects_what_a_plain_filter_selects(case: int, synthetic_root: Path, tmp_path: Path,
                                                             stz_home: Path) -> None:
    where, keep = WHERES[case]
    zoo = Zoo.open(synthetic_root, "syn")
    rows = zoo.metadata("train").to_pylist()
    expected = [r["checkpoint_id"] for r in rows if keep(r)]
    weights, meta = zoo.weight_space("train", where=where)
    assert meta.column("checkpoint_id").to_pylist() == expected
    full = zoo.split_weights("train")
    by_id = dict(zip(full.metadata.column("checkpoint_id").to_pylist(), full.to_tensor()))
    loaded = load_dataset(str(synthetic_root), "syn", split="train", where=where,
                          cache_dir=str(tmp_path / "cache")).with_format("torch")
    streamed = list(load_dataset(str(synthetic_root), "syn", split="train", where=where, streaming=True))
    assert loaded["checkpoint_id"] == [r["checkpoint_id"] for r in streamed] == expected
    assert expected, "each case selects some checkpoints"
    for cid, params in zip(loaded["checkpoint_id"], loaded["params"]):
        assert torch.equal(params, by_id[cid])
    assert weights.to_params().shape[0] == len(expected)


def test_a_selection_reads_only_its_rows(synthetic_root: Path) -> None:
    zoo = Zoo.open(synthetic_root, "syn")
    path = zoo.dir / zoo.shard_paths("train")[0]
    header = open_header(path)

    class Counting(io.FileIO):
        read_bytes = 0

        def read(self, size: int = -1) -> bytes:
            data = super().read(size)
            Counting.read_bytes += len(data)
            return data

    with Counting(path, "rb") as handle:
        block = read_row_runs(handle, header, np.array([1, 2, 6]))
    assert Counting.read_bytes == 3 * header.row_bytes
    expected = zoo.split_weights("train").shards[0][[1, 2, 6]]
    assert torch.equal(torch.from_numpy(block.copy()), expected)


def test_bad_filters_are_clear_errors(synthetic_root: Path) -> None:
    zoo = Zoo.open(synthetic_root, "syn")
    with pytest.raises(ValueError, match="where: unknown column 'lr'; metadata columns are"):
        zoo.select("train", where={"lr": 1e-3})
    with pytest.raises(ValueError, match=r"a range is a \(low, high\) pair"):
        zoo.select("train", where={"learning_rate": (1, 2, 3)})
    with pytest.raises(ValueError, match="where: unknown column"):
        load_dataset(str(synthetic_root), "syn", split="train", where={"nope": 1})
    assert len(zoo.select("train", where={"optimizer": "none-such"})) == 0
    empty, _ = zoo.weight_space("train", where={"optimizer": "none-such"})
    assert empty.to_params().shape == (0, zoo.spec.n_params)
    assert load_dataset(str(synthetic_root), "syn", split="train", where={"optimizer": "none-such"}).num_rows == 0
