"""`stz push` against the loopback Hub: upload, load back and compare checkpoint by checkpoint; refusal of a
damaged zoo before any upload; an interrupted push that leaves the zoo untouched and resumes."""

import hashlib
import uuid
from pathlib import Path

import pytest
import torch

from small_transformer_zoo import Zoo, ZooFormatError, load_dataset
from small_transformer_zoo.cli import main
from small_transformer_zoo.hub.push import push_zoo
from small_transformer_zoo.store.snapshot import manifest_files
from small_transformer_zoo.testing import HubServer


def _digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in folder.rglob("*") if p.is_file()}


def test_push_then_load_back_checkpoint_by_checkpoint(hub: HubServer, zoo_copy: Path) -> None:
    repo_id = f"me/pushed-{uuid.uuid4().hex[:8]}"
    assert main(["push", str(zoo_copy), repo_id]) == 0
    zoo = Zoo.open(zoo_copy, "syn")
    for split in zoo.splits:
        remote = load_dataset(repo_id, "syn", split=split).with_format("torch")
        local = zoo.split_weights(split)
        assert remote["checkpoint_id"] == local.metadata.column("checkpoint_id").to_pylist()
        assert torch.equal(remote[:]["params"], local.to_tensor())
    snapshot = hub.repos[repo_id].resolve("main").folder
    assert (snapshot / "README.md").read_text().startswith("---\n")
    assert not list(snapshot.rglob(".build"))


def test_pushing_a_new_version_leaves_only_its_files_on_the_hub(hub: HubServer, tmp_path: Path) -> None:
    """A rebuilt zoo pushed over its earlier version: the repo then holds exactly the new manifest's files (the
    earlier version's data files are deleted in the same commit), and loads as the new version."""
    from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

    root, repo_id = tmp_path / "zoo", f"me/versions-{uuid.uuid4().hex[:8]}"
    write_synthetic_zoo(root, "syn", runs=6, seed=1, register=False)
    (root / "syn" / "weights" / ".stray.tmp").write_bytes(b"a killed writer's leftover")
    push_zoo(root, repo_id)
    write_synthetic_zoo(root, "syn", runs=8, seed=2, register=False, overwrite=True)
    push_zoo(root, repo_id)
    snapshot = hub.repos[repo_id].resolve("main").folder
    pushed = {str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file()}
    zoo = Zoo.open(root, "syn")
    assert pushed == {"README.md", "syn/zoo.json", *(f"syn/{p}" for p in manifest_files(zoo.manifest))}
    remote = load_dataset(repo_id, "syn", split="train").with_format("torch")
    assert torch.equal(remote[:]["params"], zoo.split_weights("train").to_tensor())


def test_a_zoo_that_fails_verify_is_not_pushed(hub: HubServer, zoo_copy: Path) -> None:
    shard = next((zoo_copy / "syn" / "weights").glob("train-*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-3] + b"abc")
    hub.requests.clear()
    with pytest.raises(ZooFormatError, match="refusing to push: `stz verify` finds 1 problems"):
        push_zoo(zoo_copy, "me/damaged")
    assert not [r for r in hub.requests if r[0] in ("POST", "PUT")]


def test_an_interrupted_push_resumes_without_resending(hub: HubServer, tmp_path: Path) -> None:
    from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

    zoo_copy = tmp_path / "fresh"  # weights no other test has uploaded, so the server stores none of them yet
    write_synthetic_zoo(zoo_copy, "syn", runs=12, seed=uuid.uuid4().int % 10**6, register=False)
    repo_id = f"me/resumed-{uuid.uuid4().hex[:8]}"
    hub.requests.clear()
    before = _digests(zoo_copy / "syn")
    hub.fail_next_commit = True
    with pytest.raises(ZooFormatError, match=r"push to dataset .* failed \(HfHubHTTPError: .*commit failed.*the local "
                                             r"zoo is unchanged, run the push again"):
        push_zoo(zoo_copy, repo_id)
    assert _digests(zoo_copy / "syn") == before, "a failed push must not touch the local zoo"
    first_uploads = sum(1 for m, p, _ in hub.requests if m == "PUT")
    hub.requests.clear()
    push_zoo(zoo_copy, repo_id)
    assert sum(1 for m, p, _ in hub.requests if m == "PUT") == 0 < first_uploads
    assert load_dataset(repo_id, "syn", split="test").num_rows == Zoo.open(zoo_copy, "syn").metadata("test").num_rows
