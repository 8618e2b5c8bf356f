"""What a new user does with the README in hand: the standard DataLoader pattern, split slicing, each checkpoint
counted once, long builds that ask first, one rule for zoo names, registering a copied zoo, creating a leaderboard."""

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
import torch

from builders.build import BuildRequest, run_build
from nfn_baselines.bench.data import load_bench_data
from small_transformer_zoo import Zoo, ZooFormatError, ZooWriter, load_dataset, mnist_spec, open_zoo
from small_transformer_zoo.cli import main
from small_transformer_zoo.testing import HubServer
from tests.helpers import HANG_TIMEOUT, PROJECT, quiet

SPEC = mnist_spec()


@pytest.mark.parametrize("streaming", [False, True], ids=["prepared", "streaming"])
def test_the_standard_dataloader_pattern_works(synthetic_root: Path, tmp_path: Path, streaming: bool) -> None:
    data = load_dataset(str(synthetic_root), "syn", split="train", streaming=streaming,
                        cache_dir=str(tmp_path / "cache")).with_format("torch")
    loader = torch.utils.data.DataLoader(data, batch_size=32, num_workers=2)
    ids, params = [], []
    for batch in loader:
        assert batch["params"].shape[1] == SPEC.n_params and batch["test_accuracy"].is_floating_point()
        ids += batch["checkpoint_id"]
        params.append(batch["params"])
    zoo = Zoo.open(synthetic_root, "syn")
    expected = zoo.metadata("train").take(zoo.select("train")).column("checkpoint_id").to_pylist()
    assert sorted(ids) == sorted(expected) and len(ids) == len(set(ids)), "every row once, over both workers"
    by_id = dict(zip(expected, zoo.split_weights("train").rows(zoo.select("train"))))
    for cid, row in zip(ids, torch.cat(params)):
        assert torch.equal(row, by_id[cid])
    if streaming:
        assert data.num_shards >= 2, "a split of one shard still feeds two workers"


def test_splits_slice_as_datasets_slices_them(synthetic_root: Path, tmp_path: Path) -> None:
    cache = str(tmp_path / "cache")
    ids = lambda split: list(load_dataset(str(synthetic_root), "syn", split=split, cache_dir=cache)["checkpoint_id"])  # noqa: E731
    train, validation = ids("train"), ids("validation")
    assert ids("train[:10]") == train[:10]
    assert ids("train[:50%]") == train[: round(len(train) / 2)]
    assert ids("train+validation") == train + validation
    with pytest.raises(ZooFormatError, match="unknown split 'training'; zoo splits are .* sliced as 'train\\[:10\\]'"):
        load_dataset(str(synthetic_root), "syn", split="training")
    with pytest.raises(ValueError, match="a stream cannot be sliced; stream a split and use .take"):
        load_dataset(str(synthetic_root), "syn", split="train[:10]", streaming=True)


@pytest.fixture(scope="module")
def zoo_with_best_copies(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Runs of three stored epochs whose best checkpoint is a copy of one of them, as a build writes them."""
    root = tmp_path_factory.mktemp("copies")
    rng = np.random.default_rng(3)
    with ZooWriter(root, "copies", SPEC, register=False) as writer:
        for run in range(30):
            epochs = {e: rng.normal(0, 0.2, SPEC.n_params).astype(np.float32) for e in (1, 2, 3)}
            accuracy = {e: float(rng.uniform(0.1, 0.9)) for e in epochs}
            best = max(accuracy, key=accuracy.get)
            for epoch, is_best in [(1, False), (2, False), (3, False), (best, True)]:
                writer.add(epochs[epoch], {"run_id": f"r{run}", "epoch": epoch, "is_best": is_best,
                                           "test_accuracy": accuracy[epoch]})
    return root


def test_each_checkpoint_is_counted_once(zoo_with_best_copies: Path) -> None:
    zoo = Zoo.open(zoo_with_best_copies, "copies")
    for split in zoo.splits:
        table = zoo.metadata(split)
        runs = len(set(table.column("run_id").to_pylist()))
        best = table.filter(table.column("is_best"))
        assert all(d is not None and d.startswith(r) for d, r in zip(best.column("duplicate_of").to_pylist(),
                                                                      best.column("run_id").to_pylist()))
        assert len(zoo.select(split)) == 3 * runs and len(zoo.select(split, distinct=False)) == 4 * runs
        assert len(zoo.select(split, epochs=[3])) == runs, "an epoch's rows and not the best copies of them"
        assert len(zoo.select(split, best_only=True)) == runs
        assert load_dataset(str(zoo_with_best_copies), "copies", split=split).num_rows == 3 * runs
    data = load_bench_data(zoo, "copies")
    assert len(data.splits["train"]) == 3 * data.splits["train"].run_count


def test_a_long_build_asks_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    request = BuildRequest.of("mnist", "paper", tmp_path, device="cpu")
    with pytest.raises(ValueError, match=r"this build is estimated at [\d,.]+ hours on this device; pass --yes"):
        run_build(request, log=quiet)
    assert not any(tmp_path.iterdir()), "nothing was started"
    planned = run_build(request, dry_run=True, log=quiet)
    assert planned["cost"]["estimated_hours"] > 4
    with pytest.raises(ValueError, match="more than --max-hours 2"):
        run_build(BuildRequest.of("mnist", "paper", tmp_path, device="cpu", max_hours=2.0), log=quiet)
    assert main(["build", "--task", "mnist", "--preset", "paper", "--out", str(tmp_path), "--device", "cpu"]) == 2
    assert "pass --yes" in capsys.readouterr().err
    assert main(["build", "--task", "mnist", "--preset", "tiny", "--out", str(tmp_path), "--workers", "0"]) == 2
    assert "--workers: 0 must be at least 1" in capsys.readouterr().err


def test_one_rule_for_zoo_names(synthetic_root: Path, tmp_path: Path, stz_home: Path,
                                capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ZooFormatError, match="no such folder \\(a Hub repo id or the short name opens with"):
        Zoo.open("owner/name", "syn")
    with pytest.raises(ZooFormatError, match="no-such-folder: no such folder, and not a Hub dataset repo id"):
        open_zoo(tmp_path / "no-such-folder")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ZooFormatError, match="holds no zoo config"):
        open_zoo(empty)
    assert main(["info", "small-transformer-zoo", "--config", "syn"]) == 1  # not registered yet: the default Hub
    capsys.readouterr()
    assert main(["register", str(synthetic_root)]) == 0
    said = capsys.readouterr().out
    assert f"load_dataset('small-transformer-zoo', 'syn') now reads {synthetic_root.resolve() / 'syn'}" in said
    assert main(["info", "small-transformer-zoo", "--config", "syn"]) == 0
    assert "config syn" in capsys.readouterr().out
    assert main(["info", "small-transformer-zoo"]) == 1
    assert "choose it with --config" in capsys.readouterr().err


def test_offline_without_the_config_in_the_cache_says_so(hub: HubServer, synthetic_root: Path) -> None:
    repo_id = f"org/offline-{uuid.uuid4().hex[:8]}"
    hub.add_dataset(repo_id, synthetic_root)
    code = ("import sys; from small_transformer_zoo import load_dataset; "
            "load_dataset(sys.argv[1], 'syn', split='test')")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    out = subprocess.run([sys.executable, "-c", code, repo_id], env=env, cwd=PROJECT, capture_output=True, text=True,
                         timeout=HANG_TIMEOUT)
    assert out.returncode != 0
    assert "config 'syn' is not in the local cache and the Hub is offline (HF_HUB_OFFLINE)" in out.stderr


def test_a_leaderboard_repo_is_made_by_one_command(hub: HubServer, capsys: pytest.CaptureFixture[str]) -> None:
    from nfn_baselines.leaderboard.hub import hub_results

    repo_id = f"org/board-{uuid.uuid4().hex[:8]}"
    assert main(["leaderboard", "init", repo_id]) == 0
    assert f"created leaderboard {repo_id}" in capsys.readouterr().out
    assert hub_results(repo_id) == []
    assert main(["leaderboard", "--hub", repo_id]) == 0
    assert "no results yet" in capsys.readouterr().out
    assert main(["leaderboard", "init", repo_id]) == 1, "an existing leaderboard is never overwritten"
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_mistyped_config_through_the_short_name_suggests_the_registered_one(synthetic_root: Path,
                                                                                stz_home: Path) -> None:
    from small_transformer_zoo.store.local_index import register_local_zoo

    register_local_zoo("syn", synthetic_root)
    for read in (lambda: load_dataset("small-transformer-zoo", "sny", split="train"),
                 lambda: open_zoo("small-transformer-zoo", "sny")):
        with pytest.raises(ZooFormatError, match=r"did you mean 'syn'\? Config 'sny' is not registered on this "
                                                 r"machine and 'syn' is"):
            read()
    with pytest.raises(ZooFormatError, match=r"'syn-wide' is not registered on this machine \(registered: \['syn'\]\)"):
        load_dataset("small-transformer-zoo", "syn-wide", split="train")
    assert len(load_dataset("small-transformer-zoo", "syn", split="train")) > 0


@pytest.mark.parametrize("a,b,typo", [("mnist-mnii", "mnist-mini", True), ("sny", "syn", True),
                                      ("mnist-min", "mnist-mini", True), ("mnist-minis", "mnist-mini", True),
                                      ("mnist-mimi", "mnist-mini", True), ("mnist-tiny", "mnist-mini", False),
                                      ("mnist-wide", "mnist-mini", False), ("mnist-mini", "mnist-mini", False)])
def test_one_typo_apart(a: str, b: str, typo: bool) -> None:
    from small_transformer_zoo.hub.locate import one_typo_apart

    assert one_typo_apart(a, b) == one_typo_apart(b, a) == typo


def test_inputs_that_select_nothing_fail_at_once(synthetic_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A reversed range names itself before anything is read; `stz quickstart --epochs 0` fails before any build."""
    with pytest.raises(ValueError, match=r"where\['learning_rate'\]: the range \(0.001, 0.0001\) is reversed"):
        load_dataset(synthetic_root, "syn", where={"learning_rate": (1e-3, 1e-4)})
    with pytest.raises(ValueError, match="min_accuracy 0.8 is above max_accuracy 0.2"):
        load_dataset(synthetic_root, "syn", min_accuracy=0.8, max_accuracy=0.2)
    assert main(["bench", str(synthetic_root), "--where", "learning_rate=1e-3..1e-4"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "is reversed" in err
    started = time.perf_counter()
    assert main(["quickstart", "--epochs", "0", "--out", str(synthetic_root.parent / "never")]) == 2
    assert "--epochs: 0 must be at least 1" in capsys.readouterr().err
    assert time.perf_counter() - started < 5 and not (synthetic_root.parent / "never").exists()
