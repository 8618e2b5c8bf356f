"""`stz export-original`: zoos written in the authors' release layout, read back by the importer (weights bit for
bit, labels and hyperparameters), by a minimal reader written from the layout's documentation, and never with a
label a public copy withholds."""

from __future__ import annotations

import csv
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from small_transformer_zoo import Zoo, ZooFormatError
from small_transformer_zoo.cli import main
from small_transformer_zoo.format.architecture import ArchitectureSpec, text_spec
from small_transformer_zoo.original import import_original
from small_transformer_zoo.original.exporter import export_original, file_runs
from small_transformer_zoo.store.public_copy import write_public_copy
from small_transformer_zoo.testing.synthetic_release import write_synthetic_release
from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo
from tests.helpers import build_zoo, shared_data

HYPERPARAMETERS = ("optimizer", "learning_rate", "dropout", "w_init_std", "l2", "train_fraction", "seed")


@pytest.fixture(scope="module")
def zoos(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, str]]:
    """A built MNIST zoo, a built AG News zoo (carved from the real test set) and a synthetic zoo."""
    root = tmp_path_factory.mktemp("zoos")
    build_zoo("mnist", "tiny", root / "mnist")
    build_zoo("agnews", "tiny", root / "agnews", data_dir=shared_data("ag_news"), carve_from_test=True)
    write_synthetic_zoo(root / "synthetic", "synthetic", runs=12)
    return {"mnist": (root / "mnist", "mnist-tiny"), "agnews": (root / "agnews", "agnews-tiny"),
            "synthetic": (root / "synthetic", "synthetic")}


def _rows(zoo: Zoo) -> dict[tuple[str, str], tuple[dict, torch.Tensor]]:
    """(run, epoch label) -> (metadata row, packed weights), over every split."""
    out = {}
    for split in zoo.splits:
        weights = zoo.split_weights(split)
        for index, row in enumerate(zoo.metadata(split).to_pylist()):
            out[(row["run_id"], "best" if row["is_best"] else str(row["epoch"]))] = (row, weights.rows([index])[0])
    return out


@pytest.mark.parametrize("name", [pytest.param("mnist", marks=pytest.mark.slow), "agnews", "synthetic"])
def test_export_then_import_gives_the_same_weights_labels_and_hyperparameters(zoos, tmp_path: Path,
                                                                               name: str) -> None:
    root, config = zoos[name]
    result = export_original(root, config, tmp_path / "release")
    zoo = Zoo.open(root, config)
    original = _rows(zoo)
    assert result.checkpoints == len(original) and result.notes == []
    import_original(result.path, tmp_path / "back", "back")
    back = Zoo.open(tmp_path / "back", "back")
    assert back.spec == zoo.spec
    names = file_runs(sorted({run for run, _ in original}))
    rows = _rows(back)
    assert len(rows) == len(original)
    for (run, label), (meta, weights) in original.items():
        imported, imported_weights = rows[(names[run], label)]
        assert torch.equal(imported_weights, weights), (run, label)
        assert imported["test_accuracy"] == meta["test_accuracy"]
        assert {k: imported[k] for k in HYPERPARAMETERS} == {k: meta[k] for k in HYPERPARAMETERS}
        assert json.loads(imported["run_config"])["stz_run_id"] == run
        assert imported["is_best"] == meta["is_best"]
        assert imported["epoch"] == (-1 if meta["is_best"] else meta["epoch"])
    if zoo.spec.modality == "text":
        assert np.array_equal(back.extras()["embedding"]["table"], zoo.extras()["embedding"]["table"])


def test_an_imported_release_exported_again_is_the_release(tmp_path: Path) -> None:
    """The release's own columns come back as the release wrote them, every tensor bit for bit."""
    release = write_synthetic_release(tmp_path / "release", runs=3)
    import_original(release.top, tmp_path / "zoo", "orig")
    again = export_original(tmp_path / "zoo", "orig", tmp_path / "again")
    with open(release.csv_path, newline="") as handle:
        first = {row["ckpt_file"].rsplit("/", 1)[-1]: row for row in csv.DictReader(handle)}
    with open(again.path / "metadata" / "mnist.csv", newline="") as handle:
        second = {row["ckpt_file"].rsplit("/", 1)[-1]: row for row in csv.DictReader(handle)}
    assert set(first) == set(second)
    for name, row in first.items():
        for column, value in row.items():
            if column not in ("ckpt_file", "test_top1_accuracy"):
                assert second[name][column] == value, (name, column)
        assert float(second[name]["test_top1_accuracy"]) == float(row["test_top1_accuracy"])
        saved = torch.load(again.path / "mnist" / name, weights_only=True)
        original = torch.load(release.top / "mnist" / name, weights_only=True)
        assert saved.keys() == original.keys()
        assert all(torch.equal(saved[k].reshape(original[k].shape), original[k]) for k in original)


def _read_by_the_layout(folder: Path, spec: ArchitectureSpec) -> list[dict]:
    """A reader written from the layout's description alone: the CSV's columns, each row's file, the tensor names
    and shapes the original modules have."""
    dataset = "ag_news" if spec.modality == "text" else "mnist"
    accuracy = "test_accuracy" if spec.modality == "text" else "test_top1_accuracy"
    d, inner, hidden = spec.d_model, spec.num_heads * spec.d_head, spec.d_mlp
    shapes = {"classifier.fc1.weight": (d, d), "classifier.fc1.bias": (d,),
              "classifier.fc2.weight": (spec.num_classes, d), "classifier.fc2.bias": (spec.num_classes,)}
    for b in range(spec.num_blocks):
        shapes |= {f"encoder.{b}.attention.{n}.weight": (inner, d) for n in ("queries", "keys", "values")}
        shapes |= {f"encoder.{b}.attention.out_projection.weight": (d, inner), f"encoder.{b}.fc1.weight": (hidden, d),
                   f"encoder.{b}.fc1.bias": (hidden,), f"encoder.{b}.fc2.weight": (d, hidden),
                   f"encoder.{b}.fc2.bias": (d,)}
    if spec.modality == "vision":
        patch = spec.patch_size
        shapes |= {"embedding.conv1.weight": (d, spec.in_channels, patch, patch), "embedding.conv1.bias": (d,),
                   "embedding.pos_embedding": (spec.num_tokens, d)}
    with open(folder / "metadata" / f"{dataset}.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    for column in ("ckpt_epoch", "ckpt_file", accuracy, "lr", "optimizer", "w_init_std", "l2_regularize",
                   "train_fraction", "dropout", "seed", "n_attention_heads", "embed_dim"):
        assert column in rows[0], column
    for row in rows:
        path = folder / row["ckpt_file"]
        assert path.parent.name == dataset and path.is_file()
        run, epoch, acc = path.stem.split("_")
        assert run.isalnum() and epoch == row["ckpt_epoch"] and int(acc) == int(float(row[accuracy]) * 10000)
        assert epoch.isdigit() or epoch == ("best" if spec.modality == "text" else "best1")
        state = torch.load(path, weights_only=True)
        assert {k: tuple(v.shape) for k, v in state.items()} == shapes
        assert all(v.dtype == torch.float32 for v in state.values())
    if spec.modality == "text":
        table = torch.load(folder / dataset / "embedding.pt", weights_only=True)
        assert tuple(table["embedding.embedding.weight"].shape) == (spec.vocab_size, spec.d_model)
        assert tuple(table["embedding.pos_embedding"].shape) == (spec.num_tokens, spec.d_model)
    return rows


@pytest.mark.parametrize("name", ["mnist", "agnews"])
def test_the_export_reads_as_the_layout_documents(zoos, tmp_path: Path, name: str) -> None:
    root, config = zoos[name]
    result = export_original(root, config, tmp_path)
    zoo = Zoo.open(root, config)
    rows = _read_by_the_layout(result.path, zoo.spec)
    assert len(rows) == sum(zoo.metadata(s).num_rows for s in zoo.splits)
    epochs = {row["ckpt_epoch"] for row in rows}
    assert epochs == {str(e) for e in zoo.manifest["checkpoint_epochs"] if e != "best"} | {
        "best" if zoo.spec.modality == "text" else "best1"}, "epochs as they are, nothing renamed to 75"


def test_a_public_copy_exports_no_withheld_label(zoos, tmp_path: Path) -> None:
    root, config = zoos["mnist"]
    write_public_copy(root, tmp_path / "public", ["test", "validation"])
    result = export_original(tmp_path / "public", config, tmp_path / "out")
    full = Zoo.open(root, config)
    held_in = {r["checkpoint_id"] for r in full.metadata("train").to_pylist()}
    withheld_runs = {r["run_id"] for s in ("test", "validation") for r in full.metadata(s).to_pylist()}
    with open(result.path / "metadata" / "mnist.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == len(held_in) == result.checkpoints
    assert not {row["stz_run_id"] for row in rows} & withheld_runs
    files = {p.name for p in (result.path / "mnist").iterdir()}
    assert len(files) == len(rows)
    assert any("'test'" in note for note in result.notes) and any("'validation'" in note for note in result.notes)


def test_an_existing_target_is_refused_and_a_failed_export_leaves_nothing(zoos, tmp_path: Path) -> None:
    root, config = zoos["synthetic"]
    first = export_original(root, config, tmp_path, as_zip=True)
    assert first.path.name == "synthetic-Transformers.zip" and zipfile.is_zipfile(first.path)
    with zipfile.ZipFile(first.path) as archive:
        assert "synthetic-Transformers/metadata/synthetic.csv" in archive.namelist()
    import_original(first.path, tmp_path / "from-zip", "z")
    with pytest.raises(ZooFormatError, match="already exists; pass --overwrite"):
        export_original(root, config, tmp_path, as_zip=True)
    before = first.path.read_bytes()

    def fail(done: int, total: int) -> None:
        if done:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        export_original(root, config, tmp_path, as_zip=True, overwrite=True, progress=fail)
    assert first.path.read_bytes() == before, "the old export stays whole"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["from-zip", "synthetic-Transformers.zip"]
    export_original(root, config, tmp_path, as_zip=True, overwrite=True)
    assert zipfile.is_zipfile(first.path)


def test_run_names_are_letters_and_digits_and_unique() -> None:
    names = file_runs(["mnist-sgd-0001", "mnist-sgd_momentum-0001", "a-b", "ab", "a_b", "---"])
    assert all(n.isalnum() for n in names.values()) and len(set(names.values())) == len(names)
    assert names["mnist-sgd-0001"] == "mnistsgd0001"


def test_export_original_command(zoos, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root, config = zoos["mnist"]
    assert main(["export-original", str(root), "--config", config, "--out", str(tmp_path), "--no-progress"]) == 0
    assert f"of {root / config} in the authors' release layout to {tmp_path / 'MNIST-Transformers'}" in capsys.readouterr().out
    assert main(["export-original", str(root), "--out", str(tmp_path), "--no-progress"]) == 1
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert main(["export-original", "--help"]) == 0
    help_text = capsys.readouterr().out
    assert "--zip" in help_text and "--overwrite" in help_text and "--config" in help_text


def test_a_text_zoo_without_its_word_table_is_refused(tmp_path: Path) -> None:
    from small_transformer_zoo.store.writer import ZooWriter

    spec = text_spec(vocab_size=30, max_length=8)
    with ZooWriter(tmp_path, "text", spec, task={"name": "text"}) as writer:
        writer.add(np.zeros(spec.n_params, np.float32), {"run_id": "r", "epoch": 1, "test_accuracy": 0.5})
    with pytest.raises(ZooFormatError, match=r"without its word table \(extras 'embedding'\) cannot be exported"):
        export_original(tmp_path, "text", tmp_path / "out")
    assert not (tmp_path / "out" / "text-Transformers").exists()
