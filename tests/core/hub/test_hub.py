"""Hub loading against the loopback Hub server (small_transformer_zoo.testing): download, offline, streaming, names."""

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import torch

from small_transformer_zoo import Zoo, ZooFormatError, load_dataset
from small_transformer_zoo.store.local_index import register_local_zoo
from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo
from small_transformer_zoo.testing import HubServer
from tests.helpers import HANG_TIMEOUT, PROJECT



def _repo(hub: HubServer, folder: Path, revision: str = "main", repo_id: str | None = None) -> str:
    repo_id = repo_id or f"org/zoo-{uuid.uuid4().hex[:8]}"
    hub.add_dataset(repo_id, folder, revision)
    return repo_id


def _resolved(hub: HubServer) -> set[str]:
    return {path.split("/", 2)[2] for method, path, _ in hub.requests if not path.startswith("/")}


def test_download_fetches_only_the_split_it_needs(hub: HubServer, synthetic_root: Path) -> None:
    repo_id = _repo(hub, synthetic_root)
    ds = load_dataset(repo_id, "syn", split="test").with_format("torch")
    fetched = _resolved(hub)
    assert "syn/zoo.json" in fetched and any(p.startswith("syn/metadata/test-") for p in fetched)
    assert all(p.startswith(("syn/zoo.json", "syn/metadata/test-", "syn/weights/test-")) for p in fetched), fetched
    assert torch.equal(ds[:]["params"], Zoo.open(synthetic_root, "syn").split_weights("test").to_tensor())


def test_second_load_works_offline_from_the_cache(hub: HubServer, synthetic_root: Path) -> None:
    repo_id = _repo(hub, synthetic_root)
    online = load_dataset(repo_id, "syn", split="validation")
    code = ("import sys; from small_transformer_zoo import load_dataset; "
            "ds = load_dataset(sys.argv[1], 'syn', split='validation'); print(ds.num_rows, sum(map(sum, ds['params'])))")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    out = subprocess.run([sys.executable, "-c", code, repo_id], env=env, cwd=PROJECT, capture_output=True,
                         text=True, timeout=HANG_TIMEOUT)
    assert out.returncode == 0, out.stderr[-2000:]
    rows, total = out.stdout.split()[-2:]
    assert int(rows) == online.num_rows
    assert float(total) == pytest.approx(float(sum(map(sum, online["params"]))), rel=1e-9)


def test_streaming_from_the_hub_reads_ranges(hub: HubServer, synthetic_root: Path) -> None:
    repo_id = _repo(hub, synthetic_root)
    hub.requests.clear()
    stream = load_dataset(repo_id, "syn", split="train", streaming=True).with_format("torch")
    rows = list(stream)
    assert torch.equal(torch.stack([r["params"] for r in rows]),
                       Zoo.open(synthetic_root, "syn").split_weights("train").to_tensor())
    weight_reads = [(p, r) for m, p, r in hub.requests if "/weights/" in p and m == "GET"]
    assert weight_reads and all(r and r.startswith("bytes=") for _, r in weight_reads)
    assert all("/weights/train-" in p for p, _ in weight_reads)


def test_revisions_are_honoured(hub: HubServer, tmp_path: Path) -> None:
    write_synthetic_zoo(tmp_path / "v1", "syn", runs=6, seed=1, register=False)
    write_synthetic_zoo(tmp_path / "v2", "syn", runs=9, seed=2, register=False)
    repo_id = _repo(hub, tmp_path / "v1", "v1")
    _repo(hub, tmp_path / "v2", "main", repo_id)
    old = load_dataset(repo_id, "syn", revision="v1")
    new = load_dataset(repo_id, "syn")
    assert sum(d.num_rows for d in old.values()) == 24 and sum(d.num_rows for d in new.values()) == 36
    streamed = load_dataset(repo_id, "syn", split="train", revision="v1", streaming=True)
    assert [r["checkpoint_id"] for r in streamed] == old["train"]["checkpoint_id"]


def test_short_name_prefers_a_zoo_built_here_then_the_default_repo(
        hub: HubServer, synthetic_root: Path, stz_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    register_local_zoo("syn", synthetic_root)
    hub.requests.clear()
    local = load_dataset("small-transformer-zoo", "syn", split="test")
    assert hub.requests == [] and local.num_rows == Zoo.open(synthetic_root, "syn").metadata("test").num_rows
    repo_id = _repo(hub, synthetic_root)
    monkeypatch.setenv("STZ_REPO_ID", repo_id)
    (stz_home / "registry.json").unlink()
    remote = load_dataset("small-transformer-zoo", "syn", split="test")
    assert remote["checkpoint_id"] == local["checkpoint_id"] and _resolved(hub)


def test_unknown_config_or_repo_on_the_hub(hub: HubServer, synthetic_root: Path) -> None:
    repo_id = _repo(hub, synthetic_root)
    with pytest.raises(ZooFormatError, match="unknown config 'cifar'"):
        load_dataset(repo_id, "cifar", split="test")
    with pytest.raises(ZooFormatError, match="unknown config 'cifar'"):
        load_dataset(repo_id, "cifar", split="test", streaming=True)
    with pytest.raises(ZooFormatError, match="no such folder, and not a Hub dataset repo id"):
        load_dataset("not a repo", "syn")
    with pytest.raises(ZooFormatError, match="choose a config with argument `config`"):
        load_dataset(repo_id)
