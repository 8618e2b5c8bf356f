"""Damage on the way from the Hub: a bad download is evicted from the cache so the next load works, a stream
cut short or stalled fails soon naming the file, and a 500 is one clear error."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from small_transformer_zoo import Zoo, ZooFormatError, load_dataset
from small_transformer_zoo.testing import HubServer
from tests.helpers import metadata_file, shard_file
from tests.core.faults.read_paths import read_fast_path


def _manifest_file(config_dir: Path, _: str) -> Path:
    return config_dir / "zoo.json"


@pytest.mark.parametrize("damaged", [shard_file, metadata_file, _manifest_file], ids=["shard", "metadata", "manifest"])
def test_a_bad_hub_download_is_evicted_so_the_next_load_works(damaged: Callable[[Path, str], Path], hub: HubServer,
                                                              synthetic_root: Path, stz_home: Path,
                                                              tmp_path: Path) -> None:
    repo_id = f"org/evict-{uuid.uuid4().hex[:8]}"
    hub.add_dataset(repo_id, synthetic_root)
    hub.corrupt_once.add(f"{repo_id}/{damaged(synthetic_root / 'syn', 'train').relative_to(synthetic_root)}")
    cache = str(tmp_path / "datasets-cache")
    with pytest.raises(ZooFormatError, match=r"(sha256 is|content address).*removed from the Hugging Face cache"):
        load_dataset(repo_id, "syn", split="train", cache_dir=cache)
    loaded = load_dataset(repo_id, "syn", split="train", cache_dir=cache).with_format("torch")
    assert torch.equal(loaded[:]["params"], read_fast_path(synthetic_root))
    assert loaded[:]["test_accuracy"].tolist() == pytest.approx(
        Zoo.open(synthetic_root, "syn").metadata("train").column("test_accuracy").to_pylist())


def test_a_bad_manifest_transfer_to_a_stream_is_refused(hub: HubServer, synthetic_root: Path,
                                                         stz_home: Path) -> None:
    """Streaming reads zoo.json by range requests, outside the Hugging Face cache: bytes that differ from the
    file's content address on the Hub are refused, and the next stream reads the zoo."""
    repo_id = f"org/stream-manifest-{uuid.uuid4().hex[:8]}"
    hub.add_dataset(repo_id, synthetic_root)
    hub.corrupt_once.add(f"{repo_id}/syn/zoo.json")
    with pytest.raises(ZooFormatError, match=r"syn/zoo.json: the bytes received do not match the Hub's content "
                                             r"address [0-9a-f]{64} \(a damaged transfer\)"):
        load_dataset(repo_id, "syn", split="train", streaming=True)
    rows = load_dataset(repo_id, "syn", split="train", streaming=True)
    assert torch.equal(torch.stack([torch.as_tensor(r["params"]) for r in rows]), read_fast_path(synthetic_root))


@pytest.mark.parametrize("stall", [0.2, 10.0], ids=["cut short", "stalled"])
def test_a_stream_cut_short_or_stalled_fails_soon_naming_the_file(stall: float, hub: HubServer, synthetic_root: Path,
                                                                  stz_home: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A Hub that sends half a shard and then closes (or hangs) gets a few attempts with a read timeout, then a
    ZooFormatError naming the shard; `datasets`' own reader would retry for many minutes."""
    import small_transformer_zoo.hub.remote as remote

    monkeypatch.setattr(remote, "TIMEOUT_SECONDS", 1.0)
    monkeypatch.setattr(remote, "RETRY_WAIT_SECONDS", 0.1)
    monkeypatch.setattr(hub, "stall_seconds", stall)
    repo_id = f"org/stall-{uuid.uuid4().hex[:8]}"
    hub.add_dataset(repo_id, synthetic_root)
    shard = str(shard_file(synthetic_root / "syn", "train", 1).relative_to(synthetic_root))
    hub.cut_short.add(f"{repo_id}/{shard}")
    rows = load_dataset(repo_id, "syn", split="train", streaming=True)
    with pytest.raises(ZooFormatError, match=rf"{shard}: reading bytes=\S+ failed after 3 attempts"):
        list(rows)
    hub.cut_short.discard(f"{repo_id}/{shard}")
    got = torch.stack([torch.as_tensor(r["params"]) for r in load_dataset(repo_id, "syn", split="train",
                                                                             streaming=True)])
    assert torch.equal(got, read_fast_path(synthetic_root))


def test_hub_faults_through_load_dataset_are_one_clear_error(hub: HubServer, synthetic_root: Path, stz_home: Path,
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 500, and a transfer cut short, on the way to `load_dataset`: a ZooFormatError naming the repo or file,
    never a raw client error; the next load, with the Hub fine again, works."""
    import small_transformer_zoo.hub.remote as remote

    monkeypatch.setattr(remote, "TIMEOUT_SECONDS", 1.0)
    monkeypatch.setattr(remote, "RETRY_WAIT_SECONDS", 0.1)
    monkeypatch.setattr(hub, "stall_seconds", 0.2)
    repo_id = f"org/faults-{uuid.uuid4().hex[:8]}"
    hub.add_dataset(repo_id, synthetic_root)
    shard = str(shard_file(synthetic_root / "syn", "train").relative_to(synthetic_root))
    cache = str(tmp_path / "cache")
    for fault in ("500", "cut short"):
        if fault == "500":
            hub.fail_with[f"{repo_id}/{shard}"] = 500
        else:
            hub.cut_short.add(f"{repo_id}/{shard}")
        for streaming in (False, True):
            with pytest.raises(ZooFormatError, match=f"({repo_id}|{shard})"):
                list(load_dataset(repo_id, "syn", split="train", streaming=streaming, cache_dir=cache))
        hub.fail_with.clear()
        hub.cut_short.clear()
    assert torch.equal(_load_dataset_from(repo_id, cache), read_fast_path(synthetic_root))


def _load_dataset_from(repo_id: str, cache: str) -> torch.Tensor:
    return load_dataset(repo_id, "syn", split="train", cache_dir=cache).with_format("torch")[:]["params"]


def test_the_fast_path_from_the_hub_evicts_a_damaged_blob(hub: HubServer, synthetic_root: Path,
                                                          stz_home: Path) -> None:
    from small_transformer_zoo import open_zoo

    repo_id = f"org/fast-evict-{uuid.uuid4().hex[:8]}"
    hub.add_dataset(repo_id, synthetic_root)
    hub.corrupt_once.add(f"{repo_id}/{shard_file(synthetic_root / 'syn', 'train').relative_to(synthetic_root)}")
    with pytest.raises(ZooFormatError, match="removed from the Hugging Face cache, so the next open downloads it"):
        open_zoo(repo_id, "syn").split_weights("train")
    assert torch.equal(open_zoo(repo_id, "syn").split_weights("train").to_tensor(), read_fast_path(synthetic_root))


def test_a_damaged_manifest_and_a_damaged_shard_are_evicted_together(hub: HubServer, synthetic_root: Path,
                                                                      stz_home: Path, tmp_path: Path) -> None:
    """Both downloads damaged in the cache: the first load fails and evicts both, so one retry reads the zoo."""
    repo_id = f"org/evict-two-{uuid.uuid4().hex[:8]}"
    hub.add_dataset(repo_id, synthetic_root)
    cache = str(tmp_path / "datasets-cache")
    load_dataset(repo_id, "syn", split="train", cache_dir=cache)  # everything of the split is in the cache now
    snapshot = next(Path(os.environ["HF_HOME"]).rglob("datasets--org--evict-two-*/snapshots/*"))
    for damaged in (_manifest_file(snapshot / "syn", "train"), shard_file(synthetic_root / "syn", "train")):
        blob = (snapshot / "syn" / damaged.name if damaged.name == "zoo.json" else
                snapshot / damaged.relative_to(synthetic_root)).resolve()
        data = bytearray(blob.read_bytes())
        data[len(data) // 2] ^= 0x01
        blob.write_bytes(bytes(data))
    with pytest.raises(ZooFormatError, match=r"content address.*and 1 more damaged files of 'syn'"):
        load_dataset(repo_id, "syn", split="train", cache_dir=str(tmp_path / "fresh-cache"))
    loaded = load_dataset(repo_id, "syn", split="train", cache_dir=str(tmp_path / "fresh-cache")).with_format("torch")
    assert torch.equal(loaded[:]["params"], read_fast_path(synthetic_root))
