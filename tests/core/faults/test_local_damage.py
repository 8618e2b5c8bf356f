"""Damaged and malformed zoo files on every local read path (the fast path, `load_dataset`, streaming,
`stz verify`): shards, headers, metadata and manifests, single flipped bits and wrong field values; each is a
clear error naming the file, or harmless, never wrong weights."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from small_transformer_zoo import Zoo, ZooFormatError, ZooWriter, load_dataset
from small_transformer_zoo.format.splits import assign_split
from tests.helpers import metadata_file, rewrite_metadata, shard_file
from tests.core.faults.read_paths import READ_PATHS, read_fast_path, read_labelled, read_with_load_dataset


def _train_shard(root: Path) -> Path:
    manifest = json.loads((root / "syn" / "zoo.json").read_text())
    return root / "syn" / next(s["path"] for s in manifest["shards"] if s["split"] == "train")


def _flip_in_place_keeping_mtime(path: Path) -> None:
    """Change one weight byte without changing size, inode or mtime (only ctime moves)."""
    before = os.stat(path)
    with open(path, "r+b") as handle:
        handle.seek(-5, os.SEEK_END)
        byte = handle.read(1)
        handle.seek(-5, os.SEEK_END)
        handle.write(bytes([byte[0] ^ 0x40]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))


@pytest.mark.parametrize("read", list(READ_PATHS))
def test_shard_rewritten_in_place_after_a_verified_load(read: str, zoo_copy: Path, stz_home: Path,
                                                        tmp_path: Path) -> None:
    read_fast_path(zoo_copy)  # verified and stamped on this machine
    path = _train_shard(zoo_copy)
    _flip_in_place_keeping_mtime(path)
    with pytest.raises(ZooFormatError, match=f"{path.name}: sha256 is .* altered or damaged"):
        READ_PATHS[read](zoo_copy)


def test_a_damaged_copy_cannot_poison_the_cache_of_a_pristine_one(synthetic_root: Path, stz_home: Path,
                                                                  tmp_path: Path) -> None:
    damaged, pristine = tmp_path / "copies" / "a", tmp_path / "copies" / "b"  # one datasets cache for both
    shutil.copytree(synthetic_root, damaged)
    shutil.copytree(synthetic_root, pristine)
    read_fast_path(damaged)
    _flip_in_place_keeping_mtime(_train_shard(damaged))
    with pytest.raises(ZooFormatError, match="sha256"):
        read_with_load_dataset(damaged)
    assert torch.equal(read_with_load_dataset(pristine), read_fast_path(pristine))


def _set(column: str, index: int, value: object) -> Callable[[pa.Table], pa.Table]:
    def change(table: pa.Table) -> pa.Table:
        values = table.column(column).to_pylist()
        values[index] = value
        return table.set_column(table.schema.get_field_index(column), column,
                                pa.array(values, table.schema.field(column).type))
    return change


def _move_run_to_the_wrong_split(table: pa.Table) -> pa.Table:
    other = next(f"intruder-{i}" for i in range(1000) if assign_split(f"intruder-{i}") != "train")
    return _set("run_id", 0, other)(table)


def _drop_row(table: pa.Table) -> pa.Table:
    return table.slice(1)


METADATA_FAULTS = {
    "accuracy edited": (_set("test_accuracy", 2, 0.987654), None),
    "accuracy NaN": (_set("test_accuracy", 2, float("nan")), r"test_accuracy is nan, not a fraction"),
    "accuracy negative": (_set("test_accuracy", 2, -0.5), r"test_accuracy is -0.5, not a fraction"),
    "accuracy missing": (_set("test_accuracy", 2, None), r"test_accuracy is null, not a fraction"),
    "loss infinite": (_set("train_loss", 1, float("inf")), r"train_loss is inf, not a finite non-negative"),
    "duplicate id": (lambda t: _set("checkpoint_id", 1, t.column("checkpoint_id")[0].as_py())(t),
                     r"checkpoint_id '.*' occurs more than once"),
    "run in the wrong split": (_move_run_to_the_wrong_split, r"run 'intruder-\d+' belongs to split"),
    "row deleted": (_drop_row, r"split 'train': counts says \d+, its metadata \d+ rows"),
}


@pytest.mark.parametrize("read", list(READ_PATHS))
@pytest.mark.parametrize("fault", list(METADATA_FAULTS))
def test_metadata_faults_fail_on_every_read_path(fault: str, read: str, zoo_copy: Path, stz_home: Path) -> None:
    """Each fault twice: the file edited alone (its sha256 no longer matches), then with the manifest rewritten to
    match it (a consistent but wrong zoo), which the value checks must catch."""
    change, consistent_error = METADATA_FAULTS[fault]
    path = metadata_file(zoo_copy / "syn", "train")
    changed = change(pq.read_table(path))
    pq.write_table(changed, path)
    with pytest.raises(ZooFormatError, match=r"train-\w+.parquet: (size is|sha256 is)"):
        READ_PATHS[read](zoo_copy)
    if consistent_error is None:
        return  # a plausible edited value in a consistent zoo is indistinguishable from a real one
    rewrite_metadata(zoo_copy / "syn", "train", changed)
    with pytest.raises(ZooFormatError, match=consistent_error):
        READ_PATHS[read](zoo_copy)


def _edit_manifest(root: Path, change: Callable[[dict], None]) -> None:
    path = root / "syn" / "zoo.json"
    manifest = json.loads(path.read_text())
    change(manifest)
    path.write_text(json.dumps(manifest))


def _shard(index: int, key: str, value: object) -> Callable[[dict], None]:
    return lambda m: m["shards"][index].__setitem__(key, value)


MANIFEST_FAULTS = {
    "shard path escapes the zoo": (_shard(0, "path", "../../outside.safetensors"), r"shards\[0\].path' is "
                                                                                    r"'../../outside"),
    "absolute shard path": (_shard(0, "path", "/etc/passwd"), r"'shards\[0\].path' is '/etc/passwd'"),
    "bytes as a string": (_shard(0, "bytes", "100"), r"'shards\[0\].bytes' is '100', not a count"),
    "negative rows": (_shard(0, "rows", -1), r"'shards\[0\].rows' is -1, not a count"),
    "huge count": (_shard(0, "bytes", 10**30), r"not a count"),
    "sha256 missing": (lambda m: m["shards"][0].pop("sha256"), r"sha256' is None"),
    "split emptied by its count": (lambda m: m["counts"].__setitem__("train", 0), r"split 'train': counts says 0"),
    "shards not a list": (lambda m: m.__setitem__("shards", {"a": 1}), r"'shards' and 'extras' must be lists"),
    "metadata entry not an object": (lambda m: m["metadata"].__setitem__("train", 3), r"'metadata.train' must be"),
    "unknown split": (lambda m: m["metadata"].__setitem__("dev", m["metadata"]["train"]), r"names split 'dev'"),
    "parameter layout edited": (lambda m: m["parameters"][3].__setitem__("offset", m["parameters"][3]["offset"] + 1),
                                r"field 'parameters' differs from the architecture's layout at entry 3"),
}


@pytest.mark.parametrize("fault", list(MANIFEST_FAULTS))
def test_malformed_manifests_are_clear_errors(fault: str, zoo_copy: Path, stz_home: Path) -> None:
    change, message = MANIFEST_FAULTS[fault]
    _edit_manifest(zoo_copy, change)
    for read in READ_PATHS.values():
        with pytest.raises(ZooFormatError, match=rf"zoo.json: .*{message}"):
            read(zoo_copy)


def test_verify_counts_the_runs(zoo_copy: Path, stz_home: Path) -> None:
    """The run count is not needed to read a split, so reads take it as it is; `stz verify` counts the runs."""
    runs = Zoo.open(zoo_copy, "syn").manifest["counts"]["runs"]
    _edit_manifest(zoo_copy, lambda m: m["counts"].__setitem__("runs", runs + 1))
    assert Zoo.open(zoo_copy, "syn").verify() == [f"{zoo_copy / 'syn' / 'zoo.json'}: field 'counts.runs' is "
                                                  f"{runs + 1}, the metadata hold {runs} runs"]


def test_deeply_nested_or_invalid_json_manifest(zoo_copy: Path, stz_home: Path) -> None:
    (zoo_copy / "syn" / "zoo.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ZooFormatError, match="zoo.json: manifest is not valid JSON"):
        Zoo.open(zoo_copy, "syn")


def _header_of(path: Path) -> tuple[int, dict]:
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")
    return length, json.loads(data[8 : 8 + length])


def _rewrite_header(path: Path, change: Callable[[dict], None]) -> None:
    """Rewrite a shard's header (offsets count from the data, so its length may change) and give the manifest the
    file's new size and sha256."""
    data = path.read_bytes()
    length, header = _header_of(path)
    change(header)
    raw = json.dumps(header, separators=(",", ":")).encode()
    data = len(raw).to_bytes(8, "little") + raw + data[8 + length :]
    path.write_bytes(data)

    def update(manifest: dict) -> None:
        entry = next(s for s in manifest["shards"] if path.name in s["path"])
        entry["bytes"], entry["sha256"] = len(data), hashlib.sha256(data).hexdigest()

    _edit_manifest(path.parents[2], update)


HEADER_FAULTS = {
    "negative offset": (lambda h: h["params"].__setitem__("data_offsets", [-4, h["params"]["data_offsets"][1] - 4]),
                        r"data_offsets \[-4, \d+\] must be \[0, end\]"),
    "gap before the data": (lambda h: h["params"].__setitem__("data_offsets", [4, h["params"]["data_offsets"][1] + 4]),
                            r"data_offsets \[4, \d+\] must be \[0, end\]"),
    "offsets as strings": (lambda h: h["params"].__setitem__("data_offsets", ["0", "8"]), r"must be \[0, end\]"),
    "offsets missing": (lambda h: h["params"].pop("data_offsets"), r"bad safetensors header \(KeyError"),
    "second tensor": (lambda h: h.__setitem__("x", {"dtype": "F32", "shape": [0], "data_offsets": [0, 0]}),
                      r"entries \['x'\] besides 'params'"),
    "shape as floats": (lambda h: h["params"].__setitem__("shape", [float(s) for s in h["params"]["shape"]]),
                        r"must be F32 \[rows, n_params\]"),
    "layout edited": (lambda h: h["__metadata__"].__setitem__("layout", h["__metadata__"]["layout"].replace(
        '"offset":0', '"offset":1', 1)), r"parameter layout in the safetensors header differs"),
}


@pytest.mark.parametrize("read", list(READ_PATHS))
@pytest.mark.parametrize("fault", list(HEADER_FAULTS))
def test_malformed_shard_headers_are_clear_errors(fault: str, read: str, zoo_copy: Path, stz_home: Path) -> None:
    change, message = HEADER_FAULTS[fault]
    path = _train_shard(zoo_copy)
    _rewrite_header(path, change)
    with pytest.raises(ZooFormatError, match=rf"{path.name}: .*{message}"):
        READ_PATHS[read](zoo_copy)


def test_intact_zoo_reads_the_same_on_every_path(synthetic_root: Path, stz_home: Path) -> None:
    """The control: with nothing damaged, the three read paths agree row for row."""
    results = [read(synthetic_root) for read in READ_PATHS.values()]
    table = Zoo.open(synthetic_root, "syn").metadata("train")
    assert all(torch.equal(results[0], r) for r in results[1:])
    assert results[0].shape == (table.num_rows, Zoo.open(synthetic_root, "syn").spec.n_params)
    assert np.isfinite(pc.sum(table.column("test_accuracy")).as_py())


def _damage_target(root: Path, which: int) -> Path:
    """One of the files a read of the train split uses: its manifest, its metadata, or one of its shards."""
    config_dir = root / "syn"
    files = [config_dir / "zoo.json", metadata_file(config_dir, "train")]
    files += [shard_file(config_dir, "train", i) for i in range(len(_train_shards(config_dir)))]
    return files[which % len(files)]


def _train_shards(config_dir: Path) -> list[dict]:
    return [s for s in json.loads((config_dir / "zoo.json").read_text())["shards"] if s["split"] == "train"]


@pytest.mark.slow
@pytest.mark.parametrize("read", ["fast path", "load_dataset", "streaming"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(which=st.integers(0, 10), where=st.floats(0, 1, exclude_max=True), bit=st.integers(0, 7))
def test_one_flipped_bit_anywhere_is_an_error_or_harmless(read: str, which: int, where: float, bit: int,
                                                          synthetic_root: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """One bit flipped at a random place of a random file of the train split (manifest, metadata, a shard): each
    read path returns exactly the intact weights, labels and ids, or fails with a ZooFormatError."""
    work = tmp_path / uuid.uuid4().hex
    shutil.copytree(synthetic_root, work / "zoo")
    monkeypatch.setenv("STZ_HOME", str(work / "stz-home"))
    intact = read_labelled(synthetic_root, "fast path")
    target = _damage_target(work / "zoo", which)
    data = bytearray(target.read_bytes())
    data[int(where * len(data))] ^= 1 << bit
    target.write_bytes(bytes(data))
    try:
        got = read_labelled(work / "zoo", read)
    except ZooFormatError:
        return
    assert torch.equal(got[0], intact[0]) and got[1] == pytest.approx(intact[1], rel=1e-6), \
        f"{target.name} byte {int(where * len(data))} bit {bit}: wrong data without an error"


def _manifest_fields(value: object, prefix: tuple = ()) -> list[tuple]:
    """Paths of a manifest's fields (the first two entries of each list)."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, child in value.items():
            found += _manifest_fields(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value[:2]):
            found += _manifest_fields(child, (*prefix, index))
    return found


WRONG_VALUES = [None, -1, 0, True, 1e308, 10**40, "x", "../../etc/passwd", [], [1, 2], {}, {"a": 1}]


@pytest.mark.parametrize("read", ["fast path", "load_dataset", "streaming"])
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_manifest_field_with_a_wrong_value_is_an_error_or_harmless(read: str, data: st.DataObject,
                                                                       synthetic_root: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Any field of zoo.json given a wrong type or value (null, negative, text, lists, objects, huge numbers, a
    path out of the zoo): each read path returns the intact train split or fails with a ZooFormatError, never a
    traceback of another kind and never other data."""
    manifest = json.loads((synthetic_root / "syn" / "zoo.json").read_text())
    field = data.draw(st.sampled_from(_manifest_fields(manifest)), label="field")
    wrong = data.draw(st.sampled_from(WRONG_VALUES), label="value")
    node = manifest
    for key in field[:-1]:
        node = node[key]
    node[field[-1]] = wrong
    work = tmp_path / uuid.uuid4().hex
    shutil.copytree(synthetic_root, work / "zoo")
    monkeypatch.setenv("STZ_HOME", str(work / "stz-home"))
    (work / "zoo" / "syn" / "zoo.json").write_text(json.dumps(manifest))
    intact = read_labelled(synthetic_root, "fast path")
    try:
        got = read_labelled(work / "zoo", read)
    except ZooFormatError:
        return
    assert torch.equal(got[0], intact[0]) and got[1] == pytest.approx(intact[1], rel=1e-6), field


def test_manifests_name_each_file_once_and_fractions_are_numbers(zoo_copy: Path) -> None:
    manifest_path = zoo_copy / "syn" / "zoo.json"
    manifest = json.loads(manifest_path.read_text())
    twice = {**manifest, "shards": manifest["shards"] + manifest["shards"][:1]}
    manifest_path.write_text(json.dumps(twice))
    with pytest.raises(ZooFormatError, match="more than once; every file of a zoo is listed once"):
        Zoo.open(zoo_copy, "syn")
    nan = {**manifest, "splits": {**manifest["splits"], "fractions": {"train": float("nan"), "validation": float("nan"),
                                                                       "test": float("nan")}}}
    manifest_path.write_text(json.dumps(nan))
    with pytest.raises(ZooFormatError, match="field 'splits.fractions': split fractions must be non-negative"):
        Zoo.open(zoo_copy, "syn")
    nul = json.loads(json.dumps(manifest))
    nul["shards"][0]["path"] = nul["shards"][0]["path"] + "\x00x"
    manifest_path.write_text(json.dumps(nul))
    with pytest.raises(ZooFormatError, match="not a plain path under 'weights/'"):
        Zoo.open(zoo_copy, "syn")


def _rewrite_shard_hash(config_dir: Path, shard: Path) -> None:
    """Give the manifest a damaged shard's new sha256: a consistent but wrong zoo."""
    manifest = json.loads((config_dir / "zoo.json").read_text())
    entry = next(s for s in manifest["shards"] if s["path"] == shard.relative_to(config_dir).as_posix())
    entry["sha256"] = hashlib.sha256(shard.read_bytes()).hexdigest()
    (config_dir / "zoo.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("read", ["fast path", "load_dataset", "streaming", "verify"])
def test_every_read_path_checks_row_digests(read: str, zoo_copy: Path, stz_home: Path) -> None:
    """A shard whose sha256 was rewritten to match damaged bytes, and metadata whose digests were swapped between
    two rows (with its own sha256 rewritten): every read path refuses both."""
    shard = _train_shard(zoo_copy)
    _flip_in_place_keeping_mtime(shard)
    _rewrite_shard_hash(zoo_copy / "syn", shard)
    check = {**READ_PATHS, "verify": lambda root: Zoo.open(root, "syn").verify()}[read]
    if read == "verify":
        assert any("do not match their digest" in p for p in check(zoo_copy))
    else:
        with pytest.raises(ZooFormatError, match="do not match their digest"):
            check(zoo_copy)


@pytest.mark.parametrize("read", ["fast path", "load_dataset", "streaming"])
def test_swapped_digests_and_doubled_rows_are_refused(read: str, zoo_copy: Path, stz_home: Path) -> None:
    table = pq.read_table(metadata_file(zoo_copy / "syn", "train"))
    digests = table.column("params_digest").to_pylist()
    digests[0], digests[1] = digests[1], digests[0]
    rewrite_metadata(zoo_copy / "syn", "train", table.set_column(
        table.schema.get_field_index("params_digest"), "params_digest", pa.array(digests)))
    with pytest.raises(ZooFormatError, match="do not match their digest"):
        READ_PATHS[read](zoo_copy)
    rows = table.column("row").to_pylist()
    rows[1] = rows[0]
    rewrite_metadata(zoo_copy / "syn", "train", table.set_column(table.schema.get_field_index("row"), "row",
                                                                 pa.array(rows, pa.int64())))
    with pytest.raises(ZooFormatError, match="both point to .* row 0: each row holds one checkpoint"):
        READ_PATHS[read](zoo_copy)


def test_rows_copied_after_a_shard_changed_are_checked(zoo_copy: Path, stz_home: Path) -> None:
    """Rows are read from memory maps when copied out; an in-place edit after the check cannot reach them."""
    weights = Zoo.open(zoo_copy, "syn").split_weights("train")
    _flip_in_place_keeping_mtime(_train_shard(zoo_copy))
    with pytest.raises(ZooFormatError, match="a shard changed after it was verified"):
        weights.to_tensor()
    from small_transformer_zoo import WeightSpaceDataset

    with pytest.raises(ZooFormatError, match="a shard changed after it was verified"):
        [WeightSpaceDataset(weights)[i] for i in range(len(weights))]


def test_verify_always_checks_the_datasets_cache(zoo_copy: Path, stz_home: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    load_dataset(str(zoo_copy), "syn", split="train", cache_dir=str(cache))
    arrow = max(cache.rglob("*.arrow"), key=lambda p: p.stat().st_size)
    data = bytearray(arrow.read_bytes())
    data[len(data) // 2] ^= 0x10
    arrow.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="the datasets cache could not be used .*(differs|do not match)"):
        served = load_dataset(str(zoo_copy), "syn", split="train", cache_dir=str(cache), verify="always")
    assert served["params_digest"] == Zoo.open(zoo_copy, "syn").metadata("train").column("params_digest").to_pylist()


@pytest.mark.parametrize("where, message", [
    ({"epoch": 1.5}, r"where\['epoch'\]: 1.5 \(float\) is not an integer; column 'epoch' holds integers"),
    ({"epoch": (1.5, None)}, r"where\['epoch'\]: 1.5 \(float\) is not an integer"),
    ({"epoch": "1"}, r"where\['epoch'\]: '1' \(str\) is not an integer"),
    ({"is_best": 1}, r"where\['is_best'\]: 1 \(int\) is not a boolean"),
    ({"optimizer": 3}, r"where\['optimizer'\]: 3 \(int\) is not a text"),
])
def test_filters_mean_what_they_say(synthetic_root: Path, where: dict, message: str) -> None:
    zoo = Zoo.open(synthetic_root, "syn")
    with pytest.raises(ValueError, match=message):
        zoo.select("train", where=where)
    with pytest.raises(ValueError, match=message):
        load_dataset(str(synthetic_root), "syn", split="train", where=where)


@pytest.mark.parametrize("column, values, message", [
    ("row", lambda t: pa.array([float(r) + 0.5 for r in t.column("row").to_pylist()]), "column 'row' is double"),
    ("run_id", lambda t: pa.array([None] * t.num_rows, pa.string()), "column 'run_id' has .* nulls"),
    ("learning_rate", lambda t: pa.array(["fast"] * t.num_rows), "column 'learning_rate' is string"),
])
def test_bad_metadata_values_name_the_file_and_field(zoo_copy: Path, column: str, values, message: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from small_transformer_zoo.cli import main

    table = pq.read_table(metadata_file(zoo_copy / "syn", "train"))
    index = table.schema.get_field_index(column)
    rewrite_metadata(zoo_copy / "syn", "train", table.set_column(index, pa.field(column, values(table).type),
                                                                 values(table)))
    with pytest.raises(ZooFormatError, match=message):
        Zoo.open(zoo_copy, "syn").metadata("train")
    assert main(["verify", str(zoo_copy)]) == 1
    assert "train-" in capsys.readouterr().out


@pytest.mark.parametrize("broken", ["nan weights", "id in two splits", "two best"])
def test_what_the_writer_refuses_no_read_path_serves(broken: str, tmp_path: Path, stz_home: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A zoo written and signed by a tool without the writer's checks (here the writer with them switched off):
    `stz verify` fails, "always" fails on every read path, and "once" on those that cost no pass over the weights
    (the metadata's: two best checkpoints of a run, one id in two splits)."""
    from small_transformer_zoo.format.invariants import INVARIANTS
    from small_transformer_zoo.store import writer as writer_module
    from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

    assert len(INVARIANTS) == 3
    for check in ("finite_unless_diverged", "new_checkpoint_id", "one_best_per_run"):
        monkeypatch.setattr(writer_module, check, lambda *args, **kwargs: None)
    write_synthetic_zoo(tmp_path, "bad", runs=12, register=False)
    config_dir = tmp_path / "bad"
    zoo = Zoo.open(tmp_path, "bad")
    split = "train"
    table = zoo.metadata(split)
    if broken == "two best":
        row = next(i for i, r in enumerate(table.to_pylist()) if not r["is_best"])
        rewrite_metadata(config_dir, split, table.set_column(
            table.schema.get_field_index("is_best"), "is_best",
            pa.array([b or i == row for i, b in enumerate(table.column("is_best").to_pylist())])))
        expected = "marked is_best; a run has one best checkpoint"
    elif broken == "id in two splits":
        other = zoo.metadata("test").column("checkpoint_id")[0].as_py()
        ids = table.column("checkpoint_id").to_pylist()
        ids[0] = other
        rewrite_metadata(config_dir, split, table.set_column(table.schema.get_field_index("checkpoint_id"),
                                                             "checkpoint_id", pa.array(ids)))
        expected = f"checkpoint_id {other!r} occurs in splits"
    else:
        with ZooWriter(tmp_path, "bad", zoo.spec, overwrite=True, register=False) as writer:
            params = np.zeros(zoo.spec.n_params, np.float32)
            params[5] = np.nan
            for run in range(12):
                writer.add(params if run == 3 else np.zeros_like(params),
                           {"run_id": f"r{run}", "epoch": 1, "test_accuracy": 0.5, "diverged": False})
        split = next(s for s in zoo.splits if any(r["run_id"] == "r3" for r in Zoo.open(tmp_path, "bad")
                                                    .metadata(s).to_pylist()))
        expected = "contain NaN or inf, and it is not marked diverged"
    problems = Zoo.open(tmp_path, "bad").verify()
    assert any(expected in p for p in problems), problems
    for verify in ("always", *(("once",) if broken != "nan weights" else ())):
        with pytest.raises(ZooFormatError, match=re.escape(expected)):
            Zoo.open(tmp_path, "bad", verify=verify).split_weights(split)
        with pytest.raises(ZooFormatError, match=re.escape(expected)):
            load_dataset(str(tmp_path), "bad", split=split, cache_dir=str(tmp_path / f"cache-{verify}"),
                         verify=verify)
