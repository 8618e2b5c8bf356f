"""Import of the original release layout, on a fixture in that layout made here with real torch.save files."""

import csv
from pathlib import Path

import pytest
import torch

from small_transformer_zoo import Zoo, ZooFormatError, mnist_spec
from small_transformer_zoo.cli import main
from small_transformer_zoo.model import ZooTransformer
from small_transformer_zoo.original import parse_checkpoint_name

EPOCHS = ("1", "50", "best")


def _original_names(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The original code's module tree used other names; same order and shapes."""
    return {f"model.layer{i}.param": value for i, value in enumerate(state.values())}


def make_original_layout(folder: Path, runs: int = 6) -> dict[str, dict[str, torch.Tensor]]:
    spec = mnist_spec()
    (folder / "metadata").mkdir(parents=True)
    (folder / "checkpoints").mkdir()
    saved = {}
    with open(folder / "metadata" / "mnist.csv", "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["run", "optimizer", "lr", "dropout", "init_std", "l2_reg", "train_fraction",
                         "test_top1_accuracy"])
        for run in range(runs):
            writer.writerow([f"{run}", "adam", 1e-3 * (run + 1), 0.1, 0.2, 1e-6, 0.9, 90.0 + run])
            for epoch in EPOCHS:
                torch.manual_seed(run * 10 + len(epoch))
                state = ZooTransformer(spec).state_dict()
                accuracy = 90.0 + run if epoch == "best" else 50.0 + run
                torch.save(_original_names(state), folder / "checkpoints" / f"{run}_{epoch}_{accuracy:.2f}.pt")
                saved[f"{run}-{'best' if epoch == 'best' else f'e{int(epoch):03d}'}"] = state
    return saved


def test_import_original_layout(tmp_path: Path, stz_home: Path) -> None:
    saved = make_original_layout(tmp_path / "orig")
    assert main(["import-original", str(tmp_path / "orig"), str(tmp_path / "out"), "--config", "mnist-original",
                 "--shard-size", "4"]) == 0
    zoo = Zoo.open(tmp_path / "out", "mnist-original")
    assert zoo.verify() == []
    assert zoo.manifest["counts"]["checkpoints"] == len(saved)
    for split in zoo.splits:
        weights, meta = zoo.weight_space(split)
        for index, row in enumerate(meta.to_pylist()):
            expected = saved[row["checkpoint_id"]]
            restored = weights.state_dict(index)
            assert all(torch.equal(restored[k], expected[k]) for k in expected)
            run = int(row["run_id"])
            assert row["learning_rate"] == pytest.approx(1e-3 * (run + 1)) and row["w_init_std"] == 0.2
            if row["is_best"]:
                assert row["test_accuracy"] == pytest.approx((90.0 + run) / 100) and row["epoch"] == -1
            else:
                assert row["test_accuracy"] == pytest.approx((50.0 + run) / 100)


def test_file_names_are_parsed() -> None:
    assert parse_checkpoint_name("run_7_50_0.9812.pt") == ("run_7", "50", 0.9812)
    assert parse_checkpoint_name("12_best1_97.5.pt") == ("12", "best1", 0.975)
    with pytest.raises(ZooFormatError, match="not <run>_<epoch>_<acc>.pt"):
        parse_checkpoint_name("12_last_0.5.pt")


def test_bad_original_layouts(tmp_path: Path, stz_home: Path) -> None:
    make_original_layout(tmp_path / "orig", runs=2)
    (tmp_path / "orig" / "checkpoints" / "9_1_0.5.pt").write_bytes(b"not a torch file")
    with pytest.raises(ZooFormatError, match=r"mnist.csv: 1 runs have checkpoints but no metadata row.*'9'"):
        from small_transformer_zoo.original import import_original
        import_original(tmp_path / "orig", tmp_path / "out", "x", mnist_spec())
    assert not (tmp_path / "out" / "x" / "zoo.json").exists()
    with open(tmp_path / "orig" / "metadata" / "mnist.csv", "a") as handle:
        handle.write("9,adam,0.001,0.1,0.2,1e-6,0.9,55\n")
    assert main(["import-original", str(tmp_path / "orig"), str(tmp_path / "out"), "--config", "x"]) == 2
    torch.save({"w": torch.zeros(3)}, tmp_path / "orig" / "checkpoints" / "9_1_0.5.pt")
    with pytest.raises(ZooFormatError, match=r"9_1_0.5.pt: holds 1 float tensors, the architecture has 22"):
        import_original(tmp_path / "orig", tmp_path / "out", "x", mnist_spec())
