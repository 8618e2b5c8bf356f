"""The `datasets` builder on a local root: eager, streaming, and plain Parquet with no custom code."""

from pathlib import Path

import datasets
import pytest
import torch

from small_transformer_zoo import WeightSpaceCollator, Zoo, ZooFormatError, load_dataset
from tests.helpers import metadata_file


def test_eager_split_equals_the_fast_path(synthetic_root: Path) -> None:
    zoo = Zoo.open(synthetic_root, "syn")
    ds = load_dataset(synthetic_root, "syn", split="train")
    assert isinstance(ds, datasets.Dataset)
    assert ds.features["params"] == datasets.List(datasets.Value("float32"), length=18_506)
    torch_ds = ds.with_format("torch")
    assert torch.equal(torch_ds[:]["params"], zoo.split_weights("train").to_tensor())
    assert ds["checkpoint_id"] == zoo.metadata("train").column("checkpoint_id").to_pylist()
    loader = torch.utils.data.DataLoader(torch_ds, batch_size=8, collate_fn=WeightSpaceCollator(zoo.spec))
    batch = next(iter(loader))
    assert batch.weights.blocks[0].W_q.shape == (8, 1, 2, 32, 16)


def test_all_splits_as_a_dataset_dict(synthetic_root: Path) -> None:
    dd = load_dataset(synthetic_root, "syn")
    zoo = Zoo.open(synthetic_root, "syn")
    assert {k: v.num_rows for k, v in dd.items()} == {s: zoo.manifest["counts"][s] for s in zoo.splits}


def test_streaming_from_a_local_root(synthetic_root: Path) -> None:
    zoo = Zoo.open(synthetic_root, "syn")
    stream = load_dataset(synthetic_root, "syn", split="validation", streaming=True)
    assert isinstance(stream, datasets.IterableDataset)
    rows = list(stream.with_format("torch"))
    assert [r["checkpoint_id"] for r in rows] == zoo.metadata("validation").column("checkpoint_id").to_pylist()
    assert torch.equal(torch.stack([r["params"] for r in rows]), zoo.split_weights("validation").to_tensor())


def test_plain_datasets_reads_the_metadata_with_no_custom_code(synthetic_root: Path) -> None:
    via_card = datasets.load_dataset(str(synthetic_root), "syn")
    via_parquet = datasets.load_dataset("parquet", data_files={
        "test": str(metadata_file(synthetic_root / "syn", "test"))})
    zoo = Zoo.open(synthetic_root, "syn")
    assert via_card["test"]["checkpoint_id"] == via_parquet["test"]["checkpoint_id"] \
        == zoo.metadata("test").column("checkpoint_id").to_pylist()
    assert "params" not in via_card["train"].column_names


def test_a_damaged_shard_stops_the_builder(zoo_copy: Path, stz_home: Path, tmp_path: Path) -> None:
    """With a `datasets` cache of its own: a cache that holds this manifest's rows, verified when they were
    written, answers without reading the (damaged) files at all, which is correct data, not this test's case."""
    shard = next((zoo_copy / "syn" / "weights").glob("test-*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-4:] = b"\x01\x02\x03\x04"
    shard.write_bytes(bytes(data))
    with pytest.raises(ZooFormatError, match=f"{shard.name}: sha256"):
        load_dataset(zoo_copy, "syn", split="test", cache_dir=str(tmp_path / "datasets-cache"))


def test_unknown_split_and_config(synthetic_root: Path) -> None:
    with pytest.raises(ZooFormatError, match="unknown split 'dev'"):
        load_dataset(synthetic_root, "syn", split="dev")
    with pytest.raises(ZooFormatError, match="has no config 'nope'"):
        load_dataset(synthetic_root, "nope")


def test_an_empty_split_is_an_empty_dataset(tmp_path: Path) -> None:
    from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

    write_synthetic_zoo(tmp_path, "z", runs=3, fractions={"train": 0.5, "validation": 0.5}, register=False)
    assert Zoo.open(tmp_path, "z").manifest["counts"]["test"] == 0
    everything = load_dataset(tmp_path, "z")
    assert everything["test"].num_rows == 0 and everything["test"].features == everything["train"].features
    assert load_dataset(tmp_path, "z", split="test").num_rows == 0
    assert list(load_dataset(tmp_path, "z", split="test", streaming=True)) == []


def test_a_relative_root_loads(synthetic_root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(synthetic_root.parent)
    loaded = load_dataset(synthetic_root.name, "syn", split="test", cache_dir=str(tmp_path / "cache"))
    assert loaded.num_rows == Zoo.open(synthetic_root, "syn").manifest["counts"]["test"]
