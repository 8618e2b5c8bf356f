"""The `datasets` cache of a zoo split is checked before its rows are handed out: a changed byte, a cut, emptied,
deleted or replaced Arrow file and a description that lies are found under "once" and "always" (and what cannot be
read, under "never" too), and the cache, derived data, is prepared again from the zoo; no stamp depends on a clock;
an undamaged cache of a zoo with unknown values (nulls) is never refused."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from small_transformer_zoo import ZooFormatError, load_dataset


def _flip_a_weight(data, row: int) -> Path:
    """Flip one bit of row `row`'s first weight inside the Arrow file that holds it; returns the file."""
    path = Path(data.cache_files[0]["filename"])
    raw = bytearray(path.read_bytes())
    value = np.asarray(data.with_format("numpy")[row]["params"][:4], dtype=np.float32).tobytes()
    at = raw.find(value)
    assert at >= 0 and raw.find(value, at + 1) < 0, "the row's first weights should occur once in the file"
    raw[at] ^= 0x01
    path.write_bytes(bytes(raw))  # in place, as a stray write or a bad disk would change it
    return path


def _zoo_rows(zoo: Path) -> tuple[list[str], np.ndarray]:
    data = load_dataset(zoo, "syn", split="train", cache_dir=str(zoo.parent / "reference-cache"), verify="always")
    return data["checkpoint_id"], np.asarray(data.with_format("numpy")["params"])


def _same_as_the_zoo(data, zoo: Path) -> None:
    ids, params = _zoo_rows(zoo)
    assert data["checkpoint_id"] == ids and np.array_equal(np.asarray(data.with_format("numpy")["params"]), params)


@pytest.mark.parametrize("verify", ["once", "always"])
def test_a_changed_byte_in_the_cache_is_found_and_the_cache_prepared_again(zoo_copy: Path, tmp_path: Path,
                                                                           stz_home: Path, verify: str) -> None:
    cache = str(tmp_path / "cache")
    first = load_dataset(zoo_copy, "syn", split="train", cache_dir=cache, verify=verify)
    checkpoint = first[3]["checkpoint_id"]
    again = load_dataset(zoo_copy, "syn", split="train", cache_dir=cache, verify=verify)  # the stamped cache
    assert again[3]["checkpoint_id"] == checkpoint
    path = _flip_a_weight(first, 3)
    with pytest.warns(UserWarning, match=rf"{path.parent}: the datasets cache could not be used .*{checkpoint}"):
        served = load_dataset(zoo_copy, "syn", split="train", cache_dir=cache, verify=verify)
    _same_as_the_zoo(served, zoo_copy)


def _tamper(cache: Path, case: str) -> None:
    """Damage the `datasets` cache of the train split as the reliability review did."""
    info = next(cache.rglob("dataset_info.json"))
    arrow = next(cache.rglob("*-train.arrow"))
    if case == "row count":
        described = json.loads(info.read_text())
        described["splits"]["train"]["num_examples"] = 3
        info.write_text(json.dumps(described))
    elif case == "garbage description":
        info.write_text("garbage{")
    elif case == "cut":
        arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    elif case == "emptied":
        arrow.write_bytes(b"")
    elif case == "deleted":
        arrow.unlink()
    elif case == "replaced":
        other = pa.table({"x": [1, 2, 3]})
        with pa.OSFile(str(arrow), "wb") as sink, pa.ipc.new_stream(sink, other.schema) as writer:
            writer.write_table(other)


@pytest.mark.parametrize("verify", ["once", "always", "never"])
@pytest.mark.parametrize("case", ["row count", "garbage description", "cut", "emptied", "deleted", "replaced"])
def test_a_damaged_cache_is_prepared_again_in_every_mode(zoo_copy: Path, tmp_path: Path, stz_home: Path,
                                                         case: str, verify: str) -> None:
    """The cache's own metadata included: a `dataset_info.json` that says 3 rows used to make "once" serve 3."""
    cache = tmp_path / "cache"
    load_dataset(zoo_copy, "syn", split="train", cache_dir=str(cache))
    _tamper(cache, case)
    if case == "row count" and verify == "never":
        return  # never checks nothing, by definition
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        served = load_dataset(zoo_copy, "syn", split="train", cache_dir=str(cache), verify=verify)
    _same_as_the_zoo(served, zoo_copy)


def test_no_stamp_depends_on_the_readers_clock(zoo_copy: Path, tmp_path: Path, stz_home: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A changed byte, read with the clock an hour behind, is found; a later load with the right clock is not
    served the damage either."""
    cache = str(tmp_path / "cache")
    first = load_dataset(zoo_copy, "syn", split="train", cache_dir=cache)
    _flip_a_weight(first, 3)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 3600)
    with pytest.warns(UserWarning, match="could not be used"):
        skewed = load_dataset(zoo_copy, "syn", split="train", cache_dir=cache)
    monkeypatch.setattr(time, "time", real)
    _same_as_the_zoo(skewed, zoo_copy)
    _same_as_the_zoo(load_dataset(zoo_copy, "syn", split="train", cache_dir=cache), zoo_copy)


def test_a_full_disk_is_said_as_such(zoo_copy: Path, tmp_path: Path, stz_home: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from datasets import arrow_writer

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(arrow_writer.ArrowWriter, "write_table", full)
    monkeypatch.setattr(arrow_writer.ArrowWriter, "write_examples_on_file", full)
    with pytest.raises(OSError, match="no space left on the device of the datasets cache .* cache_dir on another disk"):
        load_dataset(zoo_copy, "syn", split="train", cache_dir=str(tmp_path / "cache"))


def test_never_trusts_the_cache(zoo_copy: Path, tmp_path: Path, stz_home: Path) -> None:
    cache = str(tmp_path / "cache")
    first = load_dataset(zoo_copy, "syn", split="train", cache_dir=cache, verify="never")
    before = np.asarray(first.with_format("numpy")[3]["params"]).copy()
    _flip_a_weight(first, 3)
    after = load_dataset(zoo_copy, "syn", split="train", cache_dir=cache, verify="never")
    assert not np.array_equal(np.asarray(after.with_format("numpy")[3]["params"]), before)


def test_always_takes_an_undamaged_zoo_with_unknown_values(zoo_copy: Path, tmp_path: Path, stz_home: Path) -> None:
    cache = str(tmp_path / "cache")
    for _ in range(2):  # a fresh cache, then the cached one
        loaded = load_dataset(zoo_copy, "syn", cache_dir=cache, verify="always")
        losses = np.asarray(loaded["train"].with_format("numpy")["train_loss"], dtype=float)
        assert np.isnan(losses).any(), "the synthetic zoo should hold unknown train losses"
