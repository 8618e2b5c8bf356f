import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from safetensors import safe_open

from small_transformer_zoo import Zoo, ZooFormatError, ZooWriter, load_dataset, mnist_spec
from small_transformer_zoo.format.metadata import COLUMNS
from small_transformer_zoo.weights.model import ZooTransformer
from tests.helpers import HANG_TIMEOUT, metadata_file, rewrite_metadata


def _write_models(root: Path, runs: int = 8, shard_size: int = 3) -> dict[str, dict[str, torch.Tensor]]:
    spec = mnist_spec()
    written = {}
    with ZooWriter(root, "m", spec, shard_size=shard_size, register=False) as writer:
        for run in range(runs):
            torch.manual_seed(run)
            state = ZooTransformer(spec).state_dict()
            cid = writer.add(state, {"run_id": f"r{run}", "epoch": 1, "test_accuracy": run / runs,
                                     "optimizer": "adam", "learning_rate": 1e-3, "seed": run})
            written[cid] = state
    return written


def test_state_dicts_round_trip_bit_for_bit(tmp_path: Path) -> None:
    written = _write_models(tmp_path)
    zoo = Zoo.open(tmp_path, "m")
    seen = 0
    for split in zoo.splits:
        weights, meta = zoo.weight_space(split)
        for index, cid in enumerate(meta.column("checkpoint_id").to_pylist()):
            restored = weights.state_dict(index)
            assert all(torch.equal(restored[k], written[cid][k]) for k in written[cid])
            seen += 1
    assert seen == len(written)


def test_shards_are_whole_packed_and_described(tmp_path: Path) -> None:
    _write_models(tmp_path, runs=10, shard_size=3)
    manifest = json.loads((tmp_path / "m" / "zoo.json").read_text())
    assert manifest["format_version"] == 1 and manifest["n_params"] == 18_506
    assert not list(tmp_path.rglob("*.tmp")), "temporary files left behind"
    for shard in manifest["shards"]:
        path = tmp_path / "m" / shard["path"]
        assert path.stat().st_size == shard["bytes"]
        with safe_open(str(path), "np") as handle:
            layout = json.loads(handle.metadata()["layout"])
            matrix = handle.get_tensor("params")
        assert matrix.shape == (shard["rows"], 18_506) and matrix.dtype == np.float32
        assert [entry["name"] for entry in layout] == [p.name for p in mnist_spec().parameters()]
    assert sum(s["rows"] for s in manifest["shards"]) == manifest["counts"]["checkpoints"] == 10
    assert "python" in manifest["provenance"] and "created_at" in manifest["provenance"]


def _mapped_from(address: int) -> str | None:
    """The file a virtual address of this process is mapped from (Linux /proc/self/maps)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        start, stop = (int(x, 16) for x in parts[0].split("-"))
        if start <= address < stop:
            return parts[5] if len(parts) == 6 else None
    return None


def test_fast_path_is_memory_mapped_and_matches_the_file(synthetic_root: Path) -> None:
    zoo = Zoo.open(synthetic_root, "syn")
    weights = zoo.split_weights("train")
    assert len(weights.shards) > 1
    first = next(s for s in zoo.manifest["shards"] if s["split"] == "train")
    first_path = (synthetic_root / "syn" / first["path"]).resolve()
    assert _mapped_from(weights.shards[0].data_ptr()) == str(first_path)
    full = weights.to_tensor()
    assert full.shape == (len(weights), 18_506)
    with safe_open(str(first_path), "pt") as handle:
        direct = handle.get_tensor("params")
    assert torch.equal(full[: direct.shape[0]], direct)
    picked = np.array([len(weights) - 1, 0, 5])
    assert torch.equal(weights.rows(picked), full[torch.from_numpy(picked)])
    # Writing to the mapped tensor never changes the file (copy-on-write mapping).
    weights.shards[0][0, 0] = 12345.0
    assert not torch.equal(Zoo.open(synthetic_root, "syn").split_weights("train").shards[0][0], weights.shards[0][0])


def test_filters_by_accuracy_epoch_and_best(synthetic_root: Path) -> None:
    zoo = Zoo.open(synthetic_root, "syn")
    meta = zoo.metadata("train")
    acc = np.asarray(meta.column("test_accuracy").to_pylist())
    picked = zoo.select("train", min_accuracy=0.4)
    assert set(picked) == set(np.nonzero(acc >= 0.4)[0]) and 0 < len(picked) < len(acc)
    epochs = np.asarray(meta.column("epoch").to_pylist())
    best = np.asarray(meta.column("is_best").to_pylist())
    assert set(zoo.select("train", epochs=[5], best_only=True)) == set(np.nonzero((epochs == 5) & best)[0])
    weights, rows = zoo.weight_space("train", min_accuracy=0.4)
    assert weights.batch_size == rows.num_rows == len(picked)
    assert min(rows.column("test_accuracy").to_pylist()) >= 0.4


def test_writer_refuses_to_overwrite_and_bad_rows(tmp_path: Path) -> None:
    _write_models(tmp_path, runs=2)
    before = (tmp_path / "m" / "zoo.json").read_bytes()
    with pytest.raises(FileExistsError, match="zoo already exists"):
        ZooWriter(tmp_path, "m", mnist_spec())
    writer = ZooWriter(tmp_path, "m", mnist_spec(), overwrite=True, register=False)
    with pytest.raises(ValueError, match="unknown metadata fields \\['accuracy'\\]"):
        writer.add(np.zeros(18_506, np.float32), {"run_id": "x", "epoch": 1, "test_accuracy": 0.5, "accuracy": 1})
    with pytest.raises(ValueError, match="test_accuracy must be a fraction"):
        writer.add(np.zeros(18_506, np.float32), {"run_id": "x", "epoch": 1, "test_accuracy": 97.0})
    with pytest.raises(ValueError, match="18000 values"):
        writer.add(np.zeros(18_000, np.float32), {"run_id": "x", "epoch": 1, "test_accuracy": 0.5})
    with pytest.raises(ValueError, match="NaN or inf"):
        writer.add(np.full(18_506, np.nan, np.float32), {"run_id": "x", "epoch": 1, "test_accuracy": 0.1})
    writer.add(np.full(18_506, np.nan, np.float32), {"run_id": "x", "epoch": 1, "test_accuracy": 0.1,
                                                     "diverged": True})
    with pytest.raises(ValueError, match="already added"):
        writer.add(np.zeros(18_506, np.float32), {"run_id": "x", "epoch": 1, "test_accuracy": 0.1})
    # Nothing is replaced until the new zoo is complete.
    assert (tmp_path / "m" / "zoo.json").read_bytes() == before
    assert Zoo.open(tmp_path, "m").verify() == []
    writer.close()
    zoo = Zoo.open(tmp_path, "m")
    assert zoo.manifest["counts"]["checkpoints"] == 1 and zoo.verify() == []
    (split,) = [s for s in zoo.splits if zoo.metadata(s).num_rows]
    assert zoo.metadata(split).column("diverged").to_pylist() == [True]


# ---- damaged zoos: one clear error each, never wrong weights ----

def _first_shard(root: Path) -> tuple[Path, dict]:
    manifest = json.loads((root / "syn" / "zoo.json").read_text())
    shard = next(s for s in manifest["shards"] if s["split"] == "train")
    return root / "syn" / shard["path"], shard


def test_truncated_shard(zoo_copy: Path) -> None:
    path, _ = _first_shard(zoo_copy)
    data = path.read_bytes()
    path.write_bytes(data[:-100])
    with pytest.raises(ZooFormatError, match=rf"{path.name}: size is \d+ bytes, the manifest says \d+ \(truncated\)"):
        Zoo.open(zoo_copy, "syn").split_weights("train")
    assert any("truncated" in p for p in Zoo.open(zoo_copy, "syn").verify())


def test_altered_shard_same_size(zoo_copy: Path, stz_home: Path) -> None:
    path, _ = _first_shard(zoo_copy)
    data = bytearray(path.read_bytes())
    data[-8:] = b"\x00" * 8
    path.write_bytes(bytes(data))
    with pytest.raises(ZooFormatError, match=f"{path.name}: sha256 is .* altered or damaged"):
        Zoo.open(zoo_copy, "syn").split_weights("train")
    assert any("sha256" in p for p in Zoo.open(zoo_copy, "syn").verify())


def test_altered_after_first_verified_load_is_caught(zoo_copy: Path, stz_home: Path) -> None:
    Zoo.open(zoo_copy, "syn").split_weights("train")  # verified and stamped
    path, _ = _first_shard(zoo_copy)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))  # a rewrite changes mtime/inode, so the stamp no longer holds
    with pytest.raises(ZooFormatError, match="sha256"):
        Zoo.open(zoo_copy, "syn").split_weights("train")


def test_missing_files(zoo_copy: Path) -> None:
    path, _ = _first_shard(zoo_copy)
    path.unlink()
    with pytest.raises(ZooFormatError, match=f"{path.name}: weight shard is missing"):
        Zoo.open(zoo_copy, "syn").split_weights("train")
    metadata_file(zoo_copy / "syn", "test").unlink()
    with pytest.raises(ZooFormatError, match=r"test-\w+.parquet: metadata file is missing"):
        Zoo.open(zoo_copy, "syn").metadata("test")
    (zoo_copy / "syn" / "zoo.json").unlink()
    with pytest.raises(ZooFormatError, match="has no config 'syn'"):
        Zoo.open(zoo_copy, "syn")


def test_other_format_version(zoo_copy: Path) -> None:
    manifest_path = zoo_copy / "syn" / "zoo.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["format_version"] = 2
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(ZooFormatError, match="zoo.json: field 'format_version' is 2; this package reads format "
                                             "version 1"):
        Zoo.open(zoo_copy, "syn")


def test_metadata_row_past_the_shard_end(zoo_copy: Path) -> None:
    path = metadata_file(zoo_copy / "syn", "train")
    table = pq.read_table(path)
    rows = table.column("row").to_pylist()
    rows[3] = 10_000
    changed = table.set_column(table.schema.get_field_index("row"), "row", pa.array(rows, pa.int64()))
    pq.write_table(changed, path)
    with pytest.raises(ZooFormatError, match=r"train-\w+.parquet: size is \d+ bytes, the manifest says"):
        Zoo.open(zoo_copy, "syn").split_weights("train")
    rewrite_metadata(zoo_copy / "syn", "train", changed)
    with pytest.raises(ZooFormatError, match=r"train-\w+.parquet: 1 rows point past their shard's end, "
                                             r"first: checkpoint '.*' -> weights/train-\d+-\w+.safetensors row 10000"):
        Zoo.open(zoo_copy, "syn").split_weights("train")


def test_unknown_config_and_split(synthetic_root: Path) -> None:
    with pytest.raises(ZooFormatError, match=r"has no config 'cifar'; its configs are \['syn'\]"):
        Zoo.open(synthetic_root, "cifar")
    with pytest.raises(ZooFormatError, match=r"unknown split 'dev'; this zoo has \['train', 'validation', 'test'\]"):
        Zoo.open(synthetic_root, "syn").split_weights("dev")


def test_verify_is_clean_on_a_good_zoo(synthetic_root: Path) -> None:
    assert Zoo.open(synthetic_root, "syn").verify() == []


def test_not_a_safetensors_file(zoo_copy: Path) -> None:
    path, shard = _first_shard(zoo_copy)
    path.write_bytes(b"\xff" * shard["bytes"])
    with pytest.raises(ZooFormatError, match=f"{path.name}: not a safetensors shard"):
        Zoo.open(zoo_copy, "syn").split_weights("train", verify="never")


def test_copy_of_a_zoo_elsewhere_still_opens(synthetic_root: Path, tmp_path: Path) -> None:
    shutil.copytree(synthetic_root / "syn", tmp_path / "moved")
    assert Zoo.open(tmp_path / "moved").config == "syn"


def test_an_empty_split_loads_as_empty(tmp_path: Path) -> None:
    from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

    write_synthetic_zoo(tmp_path, "z", runs=3, fractions={"train": 1.0}, register=False)
    zoo = Zoo.open(tmp_path, "z")
    empty = zoo.split_weights("test")
    assert len(empty) == 0 and empty.to_tensor().shape == (0, 18_506)
    assert empty.rows(np.array([], dtype=np.int64)).shape == (0, 18_506)
    assert zoo.weight_space("test")[0].batch_size == 0


def test_metadata_written_before_the_later_columns_reads_them_as_null(zoo_copy: Path, stz_home: Path) -> None:
    """Zoos written before `run_config` and `duplicate_of` load unchanged, those columns null, on every read path;
    metadata without `params_digest` is refused on every path, since no read could check its rows."""
    for split in ("train", "validation", "test"):
        path = metadata_file(zoo_copy / "syn", split)
        rewrite_metadata(zoo_copy / "syn", split, pq.read_table(path).drop_columns(["run_config", "duplicate_of"]))
    zoo = Zoo.open(zoo_copy, "syn")
    assert zoo.verify() == []
    table = zoo.metadata("train")
    assert table.column_names == list(COLUMNS)
    assert table.column("run_config").null_count == table.column("duplicate_of").null_count == table.num_rows
    loaded = load_dataset(str(zoo_copy), "syn", split="train")
    assert loaded.num_rows == table.num_rows and set(loaded["run_config"]) == {""}
    assert len(list(load_dataset(str(zoo_copy), "syn", split="train", streaming=True))) == table.num_rows
    path = metadata_file(zoo_copy / "syn", "train")
    rewrite_metadata(zoo_copy / "syn", "train", pq.read_table(path).drop_columns(["params_digest"]))
    for read in (lambda: Zoo.open(zoo_copy, "syn").split_weights("train"),
                 lambda: load_dataset(str(zoo_copy), "syn", split="train"),
                 lambda: list(load_dataset(str(zoo_copy), "syn", split="train", streaming=True))):
        with pytest.raises(ZooFormatError, match="params_digest is None, not the 32 hex digits"):
            read()


def test_a_mistyped_verify_mode_is_an_error(synthetic_root: Path) -> None:
    from small_transformer_zoo import load_dataset

    zoo = Zoo.open(synthetic_root, "syn")
    with pytest.raises(ValueError, match=r"verify='alwyas': choose one of \['once', 'always', 'never'\]"):
        zoo.split_weights("train", verify="alwyas")
    with pytest.raises(ValueError, match="verify='Always'"):
        load_dataset(synthetic_root, "syn", split="train", verify="Always")


@pytest.mark.slow
def test_processes_that_read_a_zoo_exit_cleanly(synthetic_root: Path) -> None:
    """Arrow objects collected during interpreter teardown, or arrow's thread pool still decoding Parquet at exit,
    abort a process after its work (exit 134, "terminate called without an active exception"): the package collects
    them at exit and reads metadata on the calling thread."""
    import subprocess
    import sys

    code = (f"from small_transformer_zoo import Zoo; zoo = Zoo.open({str(synthetic_root)!r}, 'syn'); "
            f"zoo.metadata('train'); zoo.split_weights('test').to_tensor()")
    codes = [subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=HANG_TIMEOUT).returncode
             for _ in range(16)]
    assert codes == [0] * 16


def test_checked_metadata_is_reused_only_while_its_file_is_unchanged(zoo_copy: Path) -> None:
    zoo = Zoo.open(zoo_copy, "syn")
    first = zoo.metadata("train")
    assert zoo.metadata("train") is first  # the same file version: checked once
    path = zoo_copy / "syn" / zoo.manifest["metadata"]["train"]["path"]
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    with open(path, "r+b") as handle:  # rewritten in place, same size, mtime put back: only ctime tells
        handle.write(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(ZooFormatError, match="sha256 is .* the file was altered or damaged"):
        zoo.metadata("train")
