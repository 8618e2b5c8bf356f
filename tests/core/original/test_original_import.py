"""`stz import-original` on small releases written in the authors' layout (real torch.save files, a real zip, the
zip served by the loopback Hub server), including the release's awkward cases."""

import csv
import json
import os
import pickle
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from small_transformer_zoo import Zoo, ZooFormatError
from small_transformer_zoo.cli import main
from small_transformer_zoo.original import import_original, parse_checkpoint_name
from small_transformer_zoo.testing.synthetic_release import write_synthetic_release
from small_transformer_zoo.testing import HubServer


def _drop_row(csv_path: Path, epoch: str) -> str:
    """Remove the first row of `epoch` from the CSV, as the release's duplicate-dropping did; returns its file."""
    with open(csv_path, newline="") as handle:
        rows = list(csv.reader(handle))
    index = next(i for i, row in enumerate(rows) if i and row[-3] == epoch)
    dropped = rows.pop(index)
    with open(csv_path, "w", newline="") as handle:
        csv.writer(handle).writerows(rows)
    return dropped[-2].rsplit("/", 1)[-1]


def _shard_hashes(manifest: dict) -> dict[str, str]:
    return {s["path"]: s["sha256"] for s in manifest["shards"]} | {
        info["path"]: info["sha256"] for info in manifest["metadata"].values()}


def _check_zoo(root: Path, config: str, release, skipped: set[str]) -> None:
    """Every imported checkpoint holds exactly the weights and accuracy of its file; skipped files are absent."""
    zoo = Zoo.open(root, config)
    assert zoo.verify() == []
    with open(release.csv_path, newline="") as handle:
        rows = {row["ckpt_file"].rsplit("/", 1)[-1]: row for row in csv.DictReader(handle)}
    seen = set()
    for split in zoo.splits:
        weights, meta = zoo.weight_space(split)
        for index, row in enumerate(meta.to_pylist()):
            config_columns = json.loads(row["run_config"])
            file_name = config_columns["ckpt_file"].rsplit("/", 1)[-1]
            seen.add(file_name)
            source = rows[file_name]
            restored = weights.state_dict(index)
            assert all(torch.equal(restored[k], v) for k, v in release.weights[file_name].items())
            assert row["test_accuracy"] == release.accuracies[file_name]
            assert row["run_id"] == file_name.split("_")[0]
            assert row["learning_rate"] == float(source["lr"]) and row["l2"] == float(source["l2_regularize"])
            assert row["optimizer"] == source["optimizer"] and row["seed"] == int(source["seed"])
            assert row["is_best"] == source["ckpt_epoch"].startswith("best")
            assert row["epoch"] == (-1 if row["is_best"] else int(source["ckpt_epoch"]))
            untyped = set(source) - {"lr", "l2_regularize", "optimizer", "seed", "dropout", "w_init_std",
                                     "train_fraction", "test_top1_accuracy", "test_accuracy"}
            assert set(config_columns) == untyped
            assert row["validation_accuracy"] is None and not row["diverged"]
    assert seen == set(release.weights) - skipped


@pytest.fixture
def release(tmp_path: Path):
    made = write_synthetic_release(tmp_path / "unpacked", runs=5)
    made.skipped = _drop_row(made.csv_path, "75")
    return made


def test_folder_import_with_or_without_the_top_folder(tmp_path: Path, stz_home: Path, release) -> None:
    with_top = import_original(tmp_path / "unpacked", tmp_path / "a", "mnist-original", shard_size=7)
    without = import_original(release.top, tmp_path / "b", "mnist-original", shard_size=7)
    _check_zoo(tmp_path / "a", "mnist-original", release, {release.skipped})
    assert with_top.files_without_row == 1 and any("1 .pt files have no CSV row" in n for n in with_top.notes)
    assert _shard_hashes(with_top.manifest) == _shard_hashes(without.manifest)
    manifest = with_top.manifest
    assert manifest["task"]["name"] == "mnist" and manifest["architecture"]["num_classes"] == 10
    assert manifest["checkpoint_epochs"] == [1, 50, 75, 100, "best"]
    assert manifest["provenance"]["positions_match_model"] is True
    assert not (tmp_path / "a" / "mnist-original" / ".import").exists()
    positions = Zoo.open(tmp_path / "a", "mnist-original").extras()["positions"]["table"]
    assert positions.shape == (49, 32)


def test_zip_and_hub_zip_give_the_same_zoo(tmp_path: Path, stz_home: Path, hub: HubServer, release) -> None:
    served = tmp_path / "served"
    served.mkdir()
    archive = served / "MNIST-Transformers.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as handle:
        for path in sorted(release.top.rglob("*")):
            handle.write(path, path.relative_to(release.top.parent).as_posix())
    from_folder = import_original(release.top, tmp_path / "folder", "mnist-original")
    from_zip = import_original(archive, tmp_path / "zip", "mnist-original")
    hub.add_dataset("authors/Small-Transformer-Zoo", served)
    address = "hf://datasets/authors/Small-Transformer-Zoo/MNIST-Transformers.zip"
    assert main(["import-original", address, str(tmp_path / "hub"), "--config", "mnist-original",
                 "--no-progress"]) == 0
    from_hub = Zoo.open(tmp_path / "hub", "mnist-original").manifest
    assert _shard_hashes(from_folder.manifest) == _shard_hashes(from_zip.manifest) == _shard_hashes(from_hub)
    assert from_zip.manifest["provenance"]["release_csv"] == "MNIST-Transformers/metadata/mnist.csv"
    _check_zoo(tmp_path / "hub", "mnist-original", release, {release.skipped})
    assert main(["import-original", "hf://datasets/authors/Small-Transformer-Zoo/Nothing.zip",
                 str(tmp_path / "x"), "--config", "c"]) == 1


def test_text_release_with_embedding_file_and_ten_output_head(tmp_path: Path, stz_home: Path, capsys) -> None:
    release = write_synthetic_release(tmp_path / "unpacked", runs=3, text=True)
    assert main(["import-original", str(tmp_path / "unpacked"), str(tmp_path / "out"), "--config",
                 "agnews-original", "--no-progress"]) == 0
    assert "note: the classifier head has 10 outputs; agnews has 4 classes" in capsys.readouterr().out
    zoo = Zoo.open(tmp_path / "out", "agnews-original")
    assert zoo.spec.modality == "text" and zoo.spec.num_classes == 10
    assert (zoo.spec.vocab_size, zoo.spec.max_length) == (50, 512)
    saved = torch.load(release.top / "ag_news" / "embedding.pt", weights_only=True)
    assert np.array_equal(zoo.extras()["embedding"]["table"], saved["embedding.embedding.weight"].numpy())
    assert zoo.manifest["task"]["name"] == "agnews"
    _check_zoo(tmp_path / "out", "agnews-original", release, set())


def test_a_row_without_its_file_is_an_error_naming_both(tmp_path: Path, stz_home: Path, release) -> None:
    missing = next(name for name in release.weights if "_50_" in name)
    (release.top / "mnist" / missing).unlink()
    with pytest.raises(ZooFormatError, match=rf"mnist.csv: line \d+ names '{missing}', which is not in"):
        import_original(tmp_path / "unpacked", tmp_path / "out", "c")
    assert not (tmp_path / "out" / "c" / "zoo.json").exists()


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_pickles_that_are_not_state_dicts_are_refused_without_running_them(tmp_path: Path, stz_home: Path,
                                                                           release) -> None:
    last = release.top / "mnist" / list(release.weights)[-1]  # converted in a worker process
    intact = last.read_bytes()
    torch.save([torch.zeros(3)], last)
    with pytest.raises(ZooFormatError, match=rf"{last.name}: holds a list, not a state_dict"):
        import_original(tmp_path / "unpacked", tmp_path / "out", "c", part_size=4, workers=2)
    last.write_bytes(intact)
    victim = release.top / "mnist" / next(iter(release.weights))
    marker = tmp_path / "ran"
    torch.save({"encoder.0.fc1.weight": _RunsCode(marker)}, victim)
    with pytest.raises(ZooFormatError, match=rf"{victim.name}: refused: holds objects other than tensors"):
        import_original(tmp_path / "unpacked", tmp_path / "out", "c")
    with open(victim, "wb") as handle:
        pickle.dump({"x": 1}, handle)
    with pytest.raises(ZooFormatError, match=rf"{victim.name}: (refused|cannot be read)"):
        import_original(tmp_path / "unpacked", tmp_path / "out", "c")
    assert not marker.exists() and not (tmp_path / "out" / "c" / "zoo.json").exists()


def test_rows_that_disagree_with_their_file_name_are_refused(tmp_path: Path, stz_home: Path, release) -> None:
    text = release.csv_path.read_text()
    name = next(iter(release.weights))
    accuracy = release.accuracies[name]
    release.csv_path.write_text(text.replace(f"{name},{accuracy}", f"{name},{accuracy / 2}", 1))
    with pytest.raises(ZooFormatError, match=r"mnist.csv:2: column 'test_top1_accuracy'.*disagrees"):
        import_original(tmp_path / "unpacked", tmp_path / "out", "c")
    release.csv_path.write_text(text.replace(",1,mnist/", ",50,mnist/", 1))
    with pytest.raises(ZooFormatError, match=r"mnist.csv:2: ckpt_epoch '50' disagrees with its file"):
        import_original(tmp_path / "unpacked", tmp_path / "out", "c")


def _import_two_parts_then_stop(tmp_path: Path) -> None:
    """An import into `tmp_path / "out"` killed after its first two parts of 6 checkpoints."""
    def stop_after_two_parts(done: int, total: int) -> None:
        if done == 12:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        import_original(tmp_path / "unpacked", tmp_path / "out", "c", part_size=6, workers=1,
                        progress=stop_after_two_parts)


def test_killed_import_resumes_to_the_same_zoo(tmp_path: Path, stz_home: Path, release) -> None:
    fresh = import_original(tmp_path / "unpacked", tmp_path / "fresh", "c", part_size=6, workers=2)

    _import_two_parts_then_stop(tmp_path)
    parts = sorted((tmp_path / "out" / "c" / ".import" / "parts").glob("*.safetensors"))
    assert [p.name for p in parts] == ["00000.safetensors", "00001.safetensors"]
    parts[1].write_bytes(parts[1].read_bytes()[:100])  # a damaged part is converted again
    resumed = import_original(tmp_path / "unpacked", tmp_path / "out", "c", part_size=6, workers=1)
    assert resumed.parts_kept == 1
    assert _shard_hashes(resumed.manifest) == _shard_hashes(fresh.manifest)
    with pytest.raises(ZooFormatError, match="holds the parts of another import"):
        (tmp_path / "out2" / "c" / ".import").mkdir(parents=True)
        (tmp_path / "out2" / "c" / ".import" / "plan.json").write_text('{"part_size": 99}')
        import_original(tmp_path / "unpacked", tmp_path / "out2", "c", part_size=6)


def test_sources_that_are_not_a_release(tmp_path: Path, stz_home: Path, release) -> None:
    with pytest.raises(ZooFormatError, match="no such folder or zip file"):
        import_original(tmp_path / "nowhere", tmp_path / "out", "c")
    (tmp_path / "bad.zip").write_bytes(b"PK not really")
    with pytest.raises(ZooFormatError, match="bad.zip: not a readable zip file"):
        import_original(tmp_path / "bad.zip", tmp_path / "out", "c")
    with pytest.raises(ZooFormatError, match="no metadata/<dataset>.csv"):
        import_original(release.top / "mnist", tmp_path / "out", "c")
    shutil.copytree(release.top, tmp_path / "unpacked" / "AG-News-Transformers")
    (tmp_path / "unpacked" / "AG-News-Transformers" / "metadata" / "mnist.csv").rename(
        tmp_path / "unpacked" / "AG-News-Transformers" / "metadata" / "ag_news.csv")
    with pytest.raises(ZooFormatError, match=r"several releases \(tasks \['agnews', 'mnist'\]\); choose one"):
        import_original(tmp_path / "unpacked", tmp_path / "out", "c")
    assert import_original(tmp_path / "unpacked", tmp_path / "out", "c", task="mnist").manifest["counts"]["runs"] == 5


def test_file_names_are_parsed() -> None:
    assert parse_checkpoint_name("ab12cd34_50_9486.pt") == ("ab12cd34", "50", 9486)
    assert parse_checkpoint_name("ab12cd34_best1_9812.pt") == ("ab12cd34", "best1", 9812)
    for bad in ("ab_12_50_9486.pt", "ab12cd34_last_9486.pt", "ab12cd34_50_0.94.pt"):
        with pytest.raises(ZooFormatError, match="not <run>_<epoch>_<acc>.pt"):
            parse_checkpoint_name(bad)


def test_a_changed_source_is_converted_again(tmp_path: Path, stz_home: Path, release) -> None:
    """A part is kept on a rerun only while the files it was converted from are unchanged."""
    _import_two_parts_then_stop(tmp_path)
    first = sorted(release.weights)[0]
    path = next((tmp_path / "unpacked").rglob(first))
    torch.save({k: v if "pos_embedding" in k else v + 1.0 for k, v in torch.load(path, weights_only=True).items()},
               path)
    resumed = import_original(tmp_path / "unpacked", tmp_path / "out", "c", part_size=6, workers=1)
    fresh = import_original(tmp_path / "unpacked", tmp_path / "fresh", "c", part_size=6, workers=1)
    assert resumed.parts_kept == 1 and _shard_hashes(resumed.manifest) == _shard_hashes(fresh.manifest)


@pytest.mark.parametrize("tensor, kind", [(torch.zeros(2, dtype=torch.complex64), "complex64"),
                                          (torch.zeros(2, dtype=torch.bfloat16), "bfloat16"),
                                          (torch.zeros(2, 2).to_sparse(), "sparse_coo")])
def test_tensors_the_zoo_does_not_store_are_refused(tmp_path: Path, stz_home: Path, release, tensor: torch.Tensor,
                                                    kind: str) -> None:
    first = sorted(release.weights)[0]
    path = next((tmp_path / "unpacked").rglob(first))
    state = torch.load(path, weights_only=True)
    name = next(iter(state))
    torch.save({**state, name: tensor}, path)
    with pytest.raises(ZooFormatError, match=f"{first}: tensor {name!r} is .*{kind}"):
        import_original(tmp_path / "unpacked", tmp_path / "out", "c", workers=1)


def test_a_zip_member_larger_than_a_checkpoint_is_refused_before_it_is_read(tmp_path: Path, stz_home: Path,
                                                                           release) -> None:
    archive = tmp_path / "bomb.zip"
    first = sorted(release.weights)[0]
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(release.top.rglob("*")):
            if path.is_file() and path.name != first:
                zf.write(path, path.relative_to(release.top.parent).as_posix())
        member = next(release.top.rglob(first)).relative_to(release.top.parent).as_posix()
        with zf.open(member, "w", force_zip64=True) as handle:  # 1 GiB of zeros: a few MB zipped
            for _ in range(1024):
                handle.write(bytes(1 << 20))
    assert archive.stat().st_size < 10 << 20
    import resource

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(ZooFormatError, match=f"{first}: declares 1,073,741,824 bytes, more than the"):
        import_original(archive, tmp_path / "out", "c", workers=1)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 200_000, "no gigabyte was read"


def test_an_import_killed_after_its_zoo_was_in_place_finishes_its_cleanup(tmp_path: Path, stz_home: Path,
                                                                         release) -> None:
    done = import_original(tmp_path / "unpacked", tmp_path / "out", "c", part_size=6, workers=1)
    work = tmp_path / "out" / "c" / ".import"
    (work / "parts").mkdir(parents=True)  # what a kill between the manifest's rename and the cleanup leaves
    (work / "plan.json").write_text(json.dumps({"release_csv_sha256": done.manifest["provenance"]["release_csv_sha256"],
                                                "part_size": 6, "architecture": done.manifest["architecture"]}))
    again = import_original(tmp_path / "unpacked", tmp_path / "out", "c", part_size=6, workers=1)
    assert again.manifest == done.manifest and not work.exists()


@pytest.mark.parametrize("text", [False, True])
def test_a_learnable_release_of_an_exact_size_imports_with_labels_its_weights_determine(
        tmp_path: Path, stz_home: Path, text: bool) -> None:
    made = write_synthetic_release(tmp_path / "unpacked", checkpoints=23, text=text, learnable=True, seed=3)
    assert len(made.accuracies) == 23 and len({name.split("_")[0] for name in made.accuracies}) == 5
    import_original(made.top, tmp_path / "zoo", "scale", shard_size=8)
    _check_zoo(tmp_path / "zoo", "scale", made, set())
    zoo = Zoo.open(tmp_path / "zoo", "scale")
    predicted, stored = [], []
    for split in zoo.splits:
        weights, meta = zoo.weight_space(split)
        shift = weights.blocks[-1].b_B.mean(dim=(1, 2)).double()  # the entries' noise averages to sd 0.035
        predicted.append(0.05 + 0.94 * torch.sigmoid(3 * shift))
        stored.append(torch.tensor(meta.column("test_accuracy").to_pylist(), dtype=torch.float64))
    predicted, stored = torch.cat(predicted), torch.cat(stored)
    assert len(stored) == 23 and (predicted - stored).abs().max() < 0.3
    assert torch.corrcoef(torch.stack([predicted, stored]))[0, 1] > 0.9
