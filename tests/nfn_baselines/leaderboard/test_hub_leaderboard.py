"""A leaderboard on the Hub, end to end on the loopback server: a public zoo copy without test labels, `stz submit`
opening a pull request, `stz review` re-scoring it against the full zoo and merging, `stz leaderboard --hub`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from huggingface_hub import CommitOperationAdd, HfApi

from nfn_baselines.bench.submission import write_submission
from nfn_baselines.leaderboard.hub import hub_results, review, submit
from nfn_baselines.leaderboard.scoring import SubmissionError, score_submission
from small_transformer_zoo import Zoo, load_dataset
from small_transformer_zoo.cli import main
from small_transformer_zoo.errors import DataError, LabelsWithheldError, ZooFormatError
from small_transformer_zoo.format.checksums import sha256_bytes
from small_transformer_zoo.store.files import atomic_write_json
from small_transformer_zoo.format.metadata import METRICS
from small_transformer_zoo.store.public_copy import write_public_copy
from small_transformer_zoo.store.reader import WeightSpaceDataset
from small_transformer_zoo.weights.collate import WeightSpaceCollator
from small_transformer_zoo.store.writer import parquet_bytes
from small_transformer_zoo.testing import HubServer


@pytest.fixture(scope="module")
def public_root(synthetic_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("public") / "zoo"
    assert write_public_copy(synthetic_root, out) == ["syn"]
    return out


def _predictions(root: Path, path: Path, noise: float = 0.05) -> Path:
    """A submission for the test split of `root`, made from the full zoo's labels plus noise."""
    meta = Zoo.open(root, "syn").metadata("test")
    truth = np.asarray(meta.column("test_accuracy").to_pylist())
    predicted = np.clip(truth + np.random.default_rng(0).normal(0, noise, len(truth)), 0.0, 1.0)
    return write_submission(path, meta.column("checkpoint_id").to_pylist(), predicted)


def test_public_copy_withholds_every_metric_of_the_test_split_only(synthetic_root: Path, public_root: Path) -> None:
    full, public = Zoo.open(synthetic_root, "syn"), Zoo.open(public_root, "syn")
    assert public.verify() == []
    assert "accuracies and losses of `syn` test are null" in (public_root / "README.md").read_text()
    test = public.metadata("test")
    assert all(test.column(c).null_count == test.num_rows for c in METRICS)
    assert test.column("checkpoint_id").equals(full.metadata("test").column("checkpoint_id"))
    assert public.metadata("train").equals(full.metadata("train"))
    assert public.withheld("test") == METRICS and public.withheld("train") == ()
    assert public.split_weights("test").to_tensor().equal(full.split_weights("test").to_tensor())
    with pytest.raises(LabelsWithheldError, match="'test_accuracy' is withheld"):
        public.split_weights("test").labels()
    with pytest.raises(LabelsWithheldError, match=r"\['test_accuracy'\] are withheld"):
        public.select("test", min_accuracy=0.5)
    for streaming in (False, True):  # the same error on every read path, never an empty selection
        with pytest.raises(LabelsWithheldError, match=r"\['test_accuracy'\] are withheld"):
            list(load_dataset(str(public_root), "syn", split="test", where={"test_accuracy": (0.5, None)},
                              streaming=streaming))
    with pytest.raises(LabelsWithheldError, match=r"\['validation_accuracy'\] are withheld"):
        public.select("test", where={"validation_accuracy": (0.1, 0.9)})
    rows = WeightSpaceDataset(public.split_weights("test"), label=None)
    batch = WeightSpaceCollator(public.spec, label=None)([rows[0], rows[1]])
    assert batch.labels.isnan().all() and batch.checkpoint_ids == test.column("checkpoint_id").to_pylist()[:2]
    with pytest.raises(ValueError, match="has no test_accuracy"):
        WeightSpaceCollator(public.spec)([{**rows[0], "test_accuracy": None}])


def test_values_in_a_withheld_column_are_refused(public_root: Path, synthetic_root: Path, tmp_path: Path) -> None:
    """A public copy whose withheld column was filled back in (manifest hash updated to match) fails to load."""
    root = tmp_path / "zoo"
    shutil.copytree(public_root, root)
    manifest_path = root / "syn" / "zoo.json"
    manifest = json.loads(manifest_path.read_text())
    table = Zoo.open(synthetic_root, "syn").metadata("test")
    data = parquet_bytes(table)
    (root / "syn" / manifest["metadata"]["test"]["path"]).write_bytes(data)
    manifest["metadata"]["test"].update(bytes=len(data), sha256=sha256_bytes(data))
    atomic_write_json(manifest_path, manifest)
    with pytest.raises(ZooFormatError, match="'train_accuracy' is withheld in split 'test' but holds values"):
        Zoo.open(root, "syn").metadata("test")
    manifest["metadata"]["test"]["withheld"] = ["test_accuracy", "accuracy"]
    atomic_write_json(manifest_path, manifest)
    with pytest.raises(ZooFormatError, match="'withheld' is .* not a list of metric columns"):
        Zoo.open(root, "syn").metadata("test")


def test_public_copy_refuses_a_used_folder_and_a_damaged_source(zoo_copy: Path, tmp_path: Path) -> None:
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "keep.txt").write_text("mine")
    assert main(["public-copy", str(zoo_copy), "--out", str(tmp_path / "used")]) == 1
    assert (tmp_path / "used" / "keep.txt").read_text() == "mine"
    shard = next((zoo_copy / "syn" / "weights").rglob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(Exception, match="fails verification"):
        write_public_copy(zoo_copy, tmp_path / "new")
    assert not (tmp_path / "new" / "syn" / "zoo.json").exists()


def test_scoring_needs_the_labels(public_root: Path, synthetic_root: Path, tmp_path: Path) -> None:
    path = _predictions(synthetic_root, tmp_path / "sub.csv")
    with pytest.raises(SubmissionError, match="labels of syn/test are withheld"):
        score_submission(path, public_root, "syn", "test")
    assert score_submission(path, synthetic_root, "syn", "test")["n"] > 0


def _new_leaderboard(hub: HubServer, name: str) -> str:
    repo_id = f"board/{name}"
    HfApi().create_repo(repo_id, repo_type="dataset")
    return repo_id


def test_submit_review_merge_and_render(hub: HubServer, public_root: Path, synthetic_root: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from small_transformer_zoo.hub.push import push_zoo

    repo_id = _new_leaderboard(hub, "e2e")
    push_zoo(public_root, "board/public-zoo")  # what participants download
    good = _predictions(synthetic_root, tmp_path / "good.csv", noise=0.02)
    rough = _predictions(synthetic_root, tmp_path / "rough.csv", noise=0.3)
    assert main(["submit", str(good), "--leaderboard", repo_id, "--zoo", "board/public-zoo",
                 "--name", "Good model"]) == 0
    out = capsys.readouterr().out
    assert "opened pull request #1" in out and "labels withheld" in out
    done = submit(rough, repo_id, synthetic_root, "syn", "test", "rough-model")  # a participant with labels
    assert done.pr_num == 2 and done.metrics["tau"] == pytest.approx(score_submission(rough, synthetic_root, "syn")["tau"])
    assert main(["leaderboard", "--hub", repo_id]) == 0
    assert "no results yet" in capsys.readouterr().out

    assert main(["review", repo_id, "--zoo", str(synthetic_root)]) == 0  # scores both, merges nothing
    out = capsys.readouterr().out
    assert "#1 Good model" in out and "#2 rough-model" in out and "merged" not in out
    assert "results.json" not in HfApi().list_repo_files(repo_id, repo_type="dataset")

    assert main(["review", repo_id, "--zoo", str(synthetic_root), "--merge"]) == 0
    assert "merged" in capsys.readouterr().out
    files = HfApi().list_repo_files(repo_id, repo_type="dataset")
    assert {"results.json", "submissions/syn/test/Good-model.csv", "submissions/syn/test/rough-model.json"} <= set(files)
    assert main(["leaderboard", "--hub", repo_id]) == 0
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if "Good model" in line or "rough-model" in line]
    assert len(rows) == 2 and "Good model" in rows[0] and "rough-model" in rows[1]
    runs = score_submission(good, synthetic_root, "syn")["runs"]
    assert runs < 10 and all(row.startswith("| - |") and f"too few runs ({runs})" in row for row in rows), \
        "the synthetic zoo's test split is too small to rank on: one rule everywhere"
    assert main(["review", repo_id, "--zoo", str(synthetic_root)]) == 0
    assert "no open pull requests" in capsys.readouterr().out


def _pull_request(repo_id: str, files: dict[str, bytes]) -> int:
    operations = [CommitOperationAdd(path, data) for path, data in files.items()]
    return HfApi().create_commit(repo_id, operations, repo_type="dataset", create_pr=True,
                                 commit_message="hand-made").pr_num


def test_review_refuses_pull_requests_that_do_more_or_do_not_match(hub: HubServer, synthetic_root: Path,
                                                                  public_root: Path, tmp_path: Path) -> None:
    repo_id = _new_leaderboard(hub, "guarded")
    good = _predictions(synthetic_root, tmp_path / "good.csv")
    claim = {"format": "stz-submission", "version": 1, "name": "x", "config": "syn", "split": "test",
             "file": "submissions/syn/test/x.csv", "sha256": sha256_bytes(good.read_bytes()), "metrics": None}
    raw_claim = json.dumps(claim).encode()
    extra = _pull_request(repo_id, {"submissions/syn/test/x.csv": good.read_bytes(),
                                    "submissions/syn/test/x.json": raw_claim, "results.json": b'{"entries": []}'})
    with pytest.raises(SubmissionError, match="must add one submission and its claim"):
        review(repo_id, extra, synthetic_root)
    swapped = _pull_request(repo_id, {"submissions/syn/test/x.csv": _predictions(synthetic_root, tmp_path / "o.csv",
                                                                                 0.4).read_bytes(),
                                      "submissions/syn/test/x.json": raw_claim})
    with pytest.raises(SubmissionError, match="has sha256 .* its claim says"):
        review(repo_id, swapped, synthetic_root, merge=True)
    elsewhere = _pull_request(repo_id, {"submissions/syn/test/y.csv": good.read_bytes(),
                                        "submissions/syn/test/y.json": raw_claim})
    with pytest.raises(SubmissionError, match="expected 'submissions/syn/test/x.csv' in the pull request"):
        review(repo_id, elsewhere, synthetic_root)
    with pytest.raises(SubmissionError, match="labels of syn/test are withheld"):
        review(repo_id, _pull_request(repo_id, {"submissions/syn/test/x.csv": good.read_bytes(),
                                                "submissions/syn/test/x.json": raw_claim}), public_root)
    assert "results.json" not in HfApi().list_repo_files(repo_id, repo_type="dataset")


def test_submit_errors_are_one_line(hub: HubServer, public_root: Path, synthetic_root: Path, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    good = _predictions(synthetic_root, tmp_path / "good.csv")
    base = ["submit", str(good), "--zoo", str(public_root), "--config", "syn"]
    assert main(base + ["--leaderboard", "board/missing", "--name", "ok"]) == 1
    err = capsys.readouterr().err
    assert "opening a pull request on dataset board/missing failed" in err and "Traceback" not in err
    repo_id = _new_leaderboard(hub, "errors")
    assert main(base + ["--leaderboard", repo_id, "--name", "../../x"]) == 1
    assert "name '../../x'" in capsys.readouterr().err
    half = tmp_path / "half.csv"
    half.write_text("checkpoint_id,predicted_accuracy\nsyn-x-e001,0.5\n")
    assert main(base[:1] + [str(half)] + base[2:] + ["--leaderboard", repo_id, "--name", "half"]) == 1
    assert "ids that are not checkpoints" in capsys.readouterr().err
    assert hub.discussions.get(repo_id, []) == []


def _claim(good: Path, split: str = "test", name: str = "x") -> bytes:
    return json.dumps({"format": "stz-submission", "version": 1, "name": name, "config": "syn", "split": split,
                       "file": f"submissions/syn/{split}/{name}.csv", "sha256": sha256_bytes(good.read_bytes()),
                       "metrics": None}).encode()


def test_review_reads_changed_paths_exactly(hub: HubServer, synthetic_root: Path, tmp_path: Path) -> None:
    """Names with spaces, even a trailing one, are the pull request's changes too: never passed over."""
    repo_id = _new_leaderboard(hub, "spaces")
    good = _predictions(synthetic_root, tmp_path / "good.csv")
    for extra in ("submissions/syn/test/evil file.txt", "results.json "):
        num = _pull_request(repo_id, {"submissions/syn/test/x.csv": good.read_bytes(),
                                      "submissions/syn/test/x.json": _claim(good), extra: b"{}"})
        with pytest.raises(SubmissionError, match="must add one submission and its claim"):
            review(repo_id, num, synthetic_root, merge=True)
    assert "results.json" not in HfApi().list_repo_files(repo_id, repo_type="dataset")


def test_a_file_swapped_after_scoring_is_never_merged(hub: HubServer, synthetic_root: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from nfn_baselines.leaderboard import hub as hub_leaderboard

    repo_id = _new_leaderboard(hub, "swap")
    good = _predictions(synthetic_root, tmp_path / "good.csv", noise=0.02)
    num = _pull_request(repo_id, {"submissions/syn/test/x.csv": good.read_bytes(),
                                  "submissions/syn/test/x.json": _claim(good)})
    scoring = hub_leaderboard.score_submission

    def score_then_swap(*args: object, **kwargs: object) -> dict:
        scores = scoring(*args, **kwargs)
        worse = _predictions(synthetic_root, tmp_path / "worse.csv", noise=0.4).read_bytes()
        HfApi().create_commit(repo_id, [CommitOperationAdd("submissions/syn/test/x.csv", worse)], repo_type="dataset",
                              revision=f"refs/pr/{num}", commit_message="swap")
        return scores

    monkeypatch.setattr(hub_leaderboard, "score_submission", score_then_swap)
    with pytest.raises(DataError, match="it changed after it was scored"):
        review(repo_id, num, synthetic_root, merge=True)
    assert hub.discussions[repo_id][num - 1]["status"] == "open"


def test_constant_predictions_and_public_splits(hub: HubServer, synthetic_root: Path, tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Constant predictions have no tau: null, never a crash; a split whose labels are public is not scored."""
    repo_id = _new_leaderboard(hub, "edge")
    meta = Zoo.open(synthetic_root, "syn").metadata("test")
    flat = write_submission(tmp_path / "flat.csv", meta.column("checkpoint_id").to_pylist(), np.full(meta.num_rows, 0.5))
    num = _pull_request(repo_id, {"submissions/syn/test/x.csv": flat.read_bytes(),
                                  "submissions/syn/test/x.json": _claim(flat)})
    assert main(["review", repo_id, "--zoo", str(synthetic_root), "--merge"]) == 0
    assert "tau undefined" in capsys.readouterr().out
    entry = hub_results(repo_id)[0]
    assert entry["metrics"]["tau"] is None
    train = Zoo.open(synthetic_root, "syn").metadata("train")
    public = write_submission(tmp_path / "train.csv", train.column("checkpoint_id").to_pylist(),
                              np.asarray(train.column("test_accuracy").to_pylist()))
    num = _pull_request(repo_id, {"submissions/syn/train/y.csv": public.read_bytes(),
                                  "submissions/syn/train/y.json": _claim(public, "train", "y")})
    with pytest.raises(SubmissionError, match="split 'train', which this leaderboard does not withhold"):
        review(repo_id, num, synthetic_root, merge=True)
    assert review(repo_id, num, synthetic_root, splits=("test", "train")).metrics["tau"] == pytest.approx(1.0)


def test_a_selected_submission_is_submitted_reviewed_and_ranked_on_its_own_checkpoints(
        hub: HubServer, public_root: Path, synthetic_root: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A paper-protocol submission (one checkpoint per run) goes through `stz submit` and `stz review` with its
    selection recorded in the claim, and ranks in a table of its own; a claim whose selection is not one is
    refused."""
    from nfn_baselines.leaderboard.hub import submission_path
    from small_transformer_zoo.format.selection import normalise_where

    repo_id = _new_leaderboard(hub, "selected")
    zoo = Zoo.open(synthetic_root, "syn")
    meta = zoo.metadata("test").take(zoo.select("test", where={"epoch": 5, "is_best": False}))
    truth = np.asarray(meta.column("test_accuracy").to_pylist())
    paper = write_submission(tmp_path / "paper.csv", meta.column("checkpoint_id").to_pylist(),
                             np.clip(truth + np.random.default_rng(1).normal(0, 0.05, len(truth)), 0, 1))
    base = ["submit", str(paper), "--leaderboard", repo_id, "--zoo", str(public_root), "--config", "syn"]
    assert main(base + ["--name", "paper model"]) == 1
    assert "--protocol paper" in capsys.readouterr().err, "all-checkpoints wants every checkpoint"
    assert main(base + ["--name", "paper model", "--protocol", "paper", "--epoch", "5"]) == 0
    every = _predictions(synthetic_root, tmp_path / "every.csv")
    assert main(["submit", str(every), "--leaderboard", repo_id, "--zoo", str(public_root), "--config", "syn",
                 "--name", "every model"]) == 0
    assert main(["review", repo_id, "--zoo", str(synthetic_root), "--merge"]) == 0
    files = set(HfApi().list_repo_files(repo_id, repo_type="dataset"))
    placed = submission_path("syn", "test", "paper model", ".csv", selection=normalise_where(
        {"epoch": 5, "is_best": False}))
    assert placed.startswith("submissions/syn/test/epoch-5-is_best-False-") and placed in files
    entries = {e["name"]: e["metrics"] for e in hub_results(repo_id)}
    expected = score_submission(paper, synthetic_root, "syn", protocol="paper", epoch=5)
    assert entries["paper model"]["tau"] == pytest.approx(expected["tau"])
    assert entries["paper model"]["selection"] == [["epoch", "eq", 5], ["is_best", "eq", False]]
    assert "selection" not in entries["every model"] and entries["every model"]["n"] > entries["paper model"]["n"]
    capsys.readouterr()
    assert main(["leaderboard", "--hub", repo_id]) == 0
    tables = capsys.readouterr().out
    assert tables.count("### syn / test") == 2 and r"/ epoch = 5, is\_best = False" in tables, "two tables"
    assert tables.count("| - | paper model |") == tables.count("| - | every model |") == 1, "too few test runs"
    claim = json.loads(_claim(paper, name="y"))
    for bad, message in (({"where": [["epoch", "gt", 5]]}, "its selection cannot be read"),
                         ({"protocol": "paper", "epoch": None}, "the paper protocol, and only it, names its epoch"),
                         ({"protocol": "mine"}, "protocol 'mine' is not one of"),
                         ({"protocol": "paper", "epoch": True}, "epoch True is not a positive whole number")):
        number = _pull_request(repo_id, {"submissions/syn/test/y.csv": paper.read_bytes(),
                                         "submissions/syn/test/y.json": json.dumps({**claim, **bad}).encode()})
        with pytest.raises(SubmissionError, match=message):
            review(repo_id, number, synthetic_root)


@pytest.mark.slow
def test_concurrent_reviews_keep_every_entry(hub: HubServer, synthetic_root: Path, tmp_path: Path) -> None:
    """Three reviews merging at once (as from three machines: no lock is shared), four times over: every entry
    reaches the results file."""
    import threading

    for trial in range(4):
        repo_id = _new_leaderboard(hub, f"concurrent-{trial}")
        numbers = [submit(_predictions(synthetic_root, tmp_path / f"{trial}-{i}.csv", noise=0.05 * (i + 1)), repo_id,
                          synthetic_root, "syn", "test", f"model-{i}").pr_num for i in range(3)]
        errors: list[BaseException] = []

        def merge(number: int) -> None:
            try:
                review(repo_id, number, synthetic_root, merge=True)
            except BaseException as exc:  # noqa: BLE001  (reported below)
                errors.append(exc)

        threads = [threading.Thread(target=merge, args=(n,)) for n in numbers]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors, errors
        assert sorted(e["name"] for e in hub_results(repo_id, "main")) == ["model-0", "model-1", "model-2"], trial
        assert all(hub.discussions[repo_id][n - 1]["status"] == "merged" for n in numbers)
