"""The `datasets` cache of a zoo split is checked before its rows are handed out: a changed byte in it is an error
under "once" and "always", and an undamaged cache of a zoo with unknown values (nulls) is never refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
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


@pytest.mark.parametrize("verify", ["once", "always"])
def test_a_changed_byte_in_the_cache_is_an_error(zoo_copy: Path, tmp_path: Path, stz_home: Path,
                                                verify: str) -> None:
    cache = str(tmp_path / "cache")
    first = load_dataset(zoo_copy, "syn", split="train", cache_dir=cache, verify=verify)
    checkpoint = first[3]["checkpoint_id"]
    again = load_dataset(zoo_copy, "syn", split="train", cache_dir=cache, verify=verify)  # the stamped cache
    assert again[3]["checkpoint_id"] == checkpoint
    path = _flip_a_weight(first, 3)
    with pytest.raises(ZooFormatError, match=rf"datasets cache .*{checkpoint}.*delete {path.parent}"):
        load_dataset(zoo_copy, "syn", split="train", cache_dir=cache, verify=verify)


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
