"""Baselines and the benchmark protocol, on a small synthetic zoo whose accuracy is a function of its weights: every
table carries intervals over test runs and run counts, the floors are in it, and the protocols and targets hold."""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

from nfn_baselines.models.baselines import FlatPredictor, statistics
from nfn_baselines.bench.data import load_bench_data
from nfn_baselines.bench.benchmark import run_benchmark
from nfn_baselines.bench.request import fixed_recipe_notes, model_specs, tuning_trials
from nfn_baselines.bench.runs import BenchRequest, run_bench
from nfn_baselines.cli import register  # noqa: F401  (the subcommand module imports cleanly)
from nfn_baselines.leaderboard.scoring import load_leaderboard, score_submission
from nfn_baselines.models.metrics import scores
from nfn_baselines.bench.report import render_markdown, score
from small_transformer_zoo import Zoo, ZooWriter, mnist_spec
from small_transformer_zoo.cli import main
from small_transformer_zoo.errors import DataError
from small_transformer_zoo.format.metadata import OPTIMIZERS
from small_transformer_zoo.weights.symmetry import sample_group_element
from small_transformer_zoo.weights.weight_space import TransformerWeights

SPEC = mnist_spec()


@pytest.fixture(scope="module")
def learnable_zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Accuracy = a smooth function of one shift added to the last block's b_B (an invariant the encoder sees) and
    to the classifier's last bias (which the flat models see): every model has signal to find. Two epochs per run,
    hyperparameters recorded, the optimizer marked in the weights too."""
    root = tmp_path_factory.mktemp("bench")
    rng = np.random.default_rng(0)
    b_b = next(p for p in SPEC.parameters() if p.name == f"blocks.{SPEC.num_blocks - 1}.mlp.fc2.bias")
    with ZooWriter(root, "learnable", SPEC, register=False) as writer:
        for run in range(150):
            shift = rng.uniform(-1, 1)
            optimizer = OPTIMIZERS[run % 4]
            for epoch in (1, 2):
                params = rng.normal(0, 0.2, SPEC.n_params).astype(np.float32)
                params[-10:] += shift * epoch / 2
                params[b_b.offset : b_b.offset + b_b.numel] += shift * epoch / 2
                params[:40] += OPTIMIZERS.index(optimizer)
                accuracy = float(1 / (1 + np.exp(-3 * shift * epoch / 2)))
                writer.add(params, {"run_id": f"r{run}", "epoch": epoch, "test_accuracy": accuracy,
                                    "train_accuracy": min(1.0, accuracy + 0.1 * (1 + shift) / 2), "optimizer": optimizer,
                                    "learning_rate": 10 ** rng.uniform(-4, -1), "test_loss": 2.0 - accuracy})
    return root


def test_statnn_features_are_the_papers_statistics() -> None:
    x = torch.arange(10.0).reshape(2, 5)
    features = statistics([x])
    assert torch.allclose(features[0], torch.tensor([2.0, 2.0, 0.0, 1.0, 2.0, 3.0, 4.0]))
    assert features.shape == (2, 7)


def test_flat_predictors_are_not_invariant_but_run() -> None:
    weights = TransformerWeights.from_params(torch.randn(4, SPEC.n_params, dtype=torch.float64), SPEC)
    g = sample_group_element(SPEC, torch.Generator().manual_seed(0))
    for mode in ("mlp", "statnn"):
        torch.manual_seed(0)
        model = FlatPredictor(SPEC, mode=mode).double()
        out = model(weights)
        assert out.shape == (4,) and ((out > 0) & (out < 1)).all()
        assert not torch.allclose(model(g.act(weights)), out, atol=1e-6)
    with pytest.raises(ValueError, match="mode"):
        FlatPredictor(SPEC, mode="cnn")


def test_scores_and_thresholds() -> None:
    true = np.array([0.1, 0.3, 0.5, 0.7, 0.9])
    result = scores(true * 2, true)
    assert result["tau"] == pytest.approx(1.0) and result["tau@0.4"] == pytest.approx(1.0)
    assert result["n@0.4"] == 3 and result["n@0.8"] == 1 and np.isnan(result["tau@0.8"])
    assert scores(true, true)["r2"] == pytest.approx(1.0) and scores(true, true)["l1"] == 0.0


@pytest.mark.slow
def test_benchmark_table_has_intervals_run_counts_floors_and_ties(learnable_zoo: Path) -> None:
    data = load_bench_data(learnable_zoo, "learnable")
    models = ["transformer_nfn", "statnn", "statnn_invariant", "lightgbm", "l2_norm", "epoch", "hyperparameters"]
    result = run_benchmark(data, BenchRequest(models=models, seeds=2, epochs=6))
    report = score(result, (0.2, 0.4, 0.6, 0.8), resamples=200)
    for name in ("transformer_nfn", "statnn", "lightgbm"):
        cell = report.cells[name]["tau"]
        assert cell.estimate > 0.4 and cell.low <= cell.estimate <= cell.high, (name, cell)
    test_runs = data.splits["test"].run_count
    assert report.cells["statnn"]["tau"].runs == test_runs and report.cells["statnn"]["tau"].checkpoints == 2 * test_runs
    assert np.isnan(report.cells["l2_norm"]["r2"].estimate), "a ranking floor has no R^2"
    assert report.best in report.tied() and report.versus_best[report.best]["tied"]
    markdown = render_markdown(report, result, "learnable")
    assert "| transformer_nfn |" in markdown and "| hyperparameters |" in markdown
    assert f"tau (all): {test_runs} runs, {2 * test_runs} checkpoints" in markdown and "95% interval" in markdown
    assert "train tau" in markdown and "validation tau" in markdown


@pytest.mark.slow
def test_stz_bench_writes_json_markdown_plot_and_leaderboard(learnable_zoo: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--zoo", str(learnable_zoo), "--config", "learnable", "--seeds", "1", "--epochs", "2",
                 "--models", "mlp", "lightgbm", "--no-floors", "--out", str(tmp_path), "--leaderboard",
                 str(tmp_path / "b.json"),
                 "--resamples", "200"]) == 0
    out = capsys.readouterr().out
    assert "| mlp |" in out and "| lightgbm |" in out and "[" in out
    saved = json.loads((tmp_path / "learnable-bench.json").read_text())
    assert set(saved["models"]) == {"mlp", "lightgbm"} and saved["seeds"] == [0]
    assert saved["bootstrap"] == {"resamples": 200, "seed": 0, "unit": "test run", "confidence": 0.95}
    rounds = saved["models"]["lightgbm"]["best_epochs"]  # the boosting rounds early stopping kept
    assert len(rounds) == 1 and all(isinstance(r, int) and 1 <= r <= 300 for r in rounds)
    assert (tmp_path / "learnable-bench-predicted-vs-true.png").is_file()
    board = {e["name"]: e["metrics"] for e in load_leaderboard(tmp_path / "b.json")}
    assert board.keys() == {"mlp", "lightgbm"}
    assert board["lightgbm"]["tau"] == pytest.approx(saved["models"]["lightgbm"]["columns"]["tau"]["estimate"])
    assert len(board["lightgbm"]["intervals"]["tau"]) == 2 and board["lightgbm"]["runs"] > 0


def test_the_paper_protocol_filters_then_trains_per_threshold(learnable_zoo: Path) -> None:
    data = load_bench_data(learnable_zoo, "learnable", protocol="paper", epoch=2)
    assert set(data.splits["train"].metadata.column("epoch").to_pylist()) == {2}
    assert len(data.splits["train"]) == data.splits["train"].run_count, "one checkpoint per run"
    conditions = data.conditions((0.4, 0.6))
    assert [c.name for c in conditions] == ["all", ">=0.4", ">=0.6"]
    for condition in conditions[1:]:
        for split in condition.splits.values():
            assert (split.accuracy >= condition.threshold).all()
    result = run_benchmark(data, BenchRequest(models=["lightgbm", "l2_norm"], seeds=1, epochs=2, thresholds=(0.4, 0.6)))
    report = score(result, (0.4, 0.6), resamples=100)
    above = conditions[1].splits["test"]
    assert report.cells["lightgbm"]["tau@0.4"].runs == above.run_count
    with pytest.raises(DataError, match="choose the epoch of the paper protocol with --epoch"):
        load_bench_data(learnable_zoo, "learnable", protocol="paper")
    with pytest.raises(ValueError, match="--epoch belongs to the paper protocol"):
        load_bench_data(learnable_zoo, "learnable", epoch=2)


@pytest.mark.slow
def test_a_paper_protocol_submission_is_scored_on_the_checkpoints_it_was_made_for(
        learnable_zoo: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    board = tmp_path / "board.json"
    assert main(["bench", str(learnable_zoo), "--config", "learnable", "--protocol", "paper", "--epoch", "2",
                 "--seeds", "1", "--epochs", "2", "--models", "lightgbm", "l2_norm", "--no-floors", "--thresholds", "0.6",
                 "--out", str(tmp_path), "--leaderboard", str(board), "--resamples", "100"]) == 0
    assert "no submission entered in" in capsys.readouterr().err, "the L2 norm ranks; it does not predict accuracies"
    assert not (tmp_path / "submissions" / "learnable-bench-paper-l2_norm.csv").exists(), "no file the scorer refuses"
    saved = json.loads((tmp_path / "learnable-bench-paper.json").read_text())
    entries = load_leaderboard(board)
    assert {e["name"] for e in entries} == {"lightgbm"}
    lightgbm = next(e["metrics"] for e in entries if e["name"] == "lightgbm")
    assert lightgbm["tau"] == pytest.approx(saved["models"]["lightgbm"]["columns"]["tau"]["estimate"])
    assert lightgbm["selection"] == [["epoch", "eq", 2], ["is_best", "eq", False]] and lightgbm["epoch"] == 2
    submission = tmp_path / "submissions" / "learnable-bench-paper-lightgbm.csv"
    with pytest.raises(DataError, match=r"with no prediction: .*scored with the same protocol \(--protocol paper"):
        score_submission(submission, learnable_zoo, "learnable")
    assert main(["score", str(submission), "--zoo", str(learnable_zoo), "--config", "learnable", "--protocol",
                 "paper", "--epoch", "2", "--leaderboard", str(board), "--name", "lightgbm"]) == 0
    assert "(epoch = 2, is_best = False)" in capsys.readouterr().out
    assert len(load_leaderboard(board)) == 1, "the same name and selection is replaced"
    every = tmp_path / "every.csv"
    test = Zoo.open(learnable_zoo, "learnable")
    meta = test.metadata("test").take(test.select("test"))
    every.write_text("checkpoint_id,predicted_accuracy\n" + "".join(
        f"{cid},{acc}\n" for cid, acc in zip(meta.column("checkpoint_id").to_pylist(),
                                             meta.column("test_accuracy").to_pylist())))
    assert main(["score", str(every), "--zoo", str(learnable_zoo), "--config", "learnable", "--leaderboard",
                 str(board), "--name", "lightgbm"]) == 0
    assert len(load_leaderboard(board)) == 2, "scores on other checkpoints rank in their own table"
    capsys.readouterr()
    assert main(["leaderboard", str(board)]) == 0
    tables = capsys.readouterr().out
    assert r"### learnable / test / test\_accuracy / epoch = 2, is\_best = False" in tables
    assert "### learnable / test / test\\_accuracy\n" in tables


def test_a_threshold_that_leaves_too_few_checkpoints_is_not_trained_and_says_so(learnable_zoo: Path) -> None:
    data = load_bench_data(learnable_zoo, "learnable", protocol="paper", epoch=2)
    top = float(data.splits["test"].accuracy.max())
    result = run_benchmark(data, BenchRequest(models=["mlp", "lightgbm", "random_forest"], seeds=1, epochs=2,
                                              thresholds=(0.4, top)))
    assert set(result.skipped) == {f">={top:g}"}
    report = score(result, (0.4, top), resamples=50)
    assert np.isnan(report.cells["mlp"][f"tau@{top:g}"].estimate)
    assert np.isfinite(report.cells["mlp"]["tau@0.4"].estimate)
    table = render_markdown(report, result, "learnable")
    runs = report.cells["mlp"][f"tau@{top:g}"].runs
    assert f"Not shown, resting on fewer than 10 test runs: tau (acc >= {top:g}) ({runs})" in table
    assert "Not trained at" not in table, "notes speak only of the columns shown"
    # a forest whose leaves need 50 checkpoints cannot split this small a training split: the table says why
    # its tau is missing, and a model that varies is not listed
    assert len(result.conditions[1].splits["train"]) < 100
    assert np.isnan(report.cells["random_forest"]["tau@0.4"].estimate)
    assert "random_forest" in report.constant["tau@0.4"] and "mlp" not in report.constant["tau@0.4"]
    assert "No tau (acc >= 0.4) for " in table and "constant predictions on its test checkpoints" in table


def test_where_selects_as_the_fast_path_does(learnable_zoo: Path) -> None:
    from small_transformer_zoo import Zoo

    data = load_bench_data(learnable_zoo, "learnable", where={"optimizer": ["adam", "sgd"], "epoch": 2})
    zoo = Zoo.open(learnable_zoo, "learnable")
    for name, split in data.splits.items():
        expected = zoo.metadata(name).take(zoo.select(name, where={"optimizer": ["adam", "sgd"], "epoch": 2}))
        assert split.metadata.column("checkpoint_id").to_pylist() == expected.column("checkpoint_id").to_pylist()


@pytest.mark.slow
@pytest.mark.parametrize("target", ["generalization_gap", "test_loss", "learning_rate", "epoch", "optimizer"])
def test_every_target_trains_scores_and_submits(learnable_zoo: Path, tmp_path: Path, target: str) -> None:
    from small_transformer_zoo import Zoo

    request = BenchRequest(models=["statnn", "lightgbm", "hyperparameters"], seeds=1, epochs=2, target=target,
                           resamples=100)
    outcome = run_bench(Zoo.open(learnable_zoo, "learnable"), request, tmp_path)
    main_column = "accuracy" if target == "optimizer" else "tau"
    assert outcome.report.main == main_column
    submission = outcome.paths["submission:lightgbm"]
    assert submission.read_text().splitlines()[0] == f"checkpoint_id,predicted_{target}"
    metrics = score_submission(submission, learnable_zoo, "learnable", "test", target=target)
    estimate = outcome.report.cells["lightgbm"][main_column].estimate
    assert metrics["target"] == target and metrics[main_column] == pytest.approx(estimate)
    if target == "optimizer":
        assert outcome.report.cells["lightgbm"]["accuracy"].estimate > 0.9, "the optimizer is written in the weights"


def test_a_target_the_zoo_does_not_record_is_a_clear_error(tmp_path: Path) -> None:
    """As an imported release records no train accuracy, it has no generalization gap."""
    rng = np.random.default_rng(1)
    with ZooWriter(tmp_path, "no-train", SPEC, register=False) as writer:
        for run in range(40):
            writer.add(rng.normal(0, 0.2, SPEC.n_params).astype(np.float32),
                       {"run_id": f"r{run}", "epoch": 1, "test_accuracy": float(rng.uniform())})
    with pytest.raises(DataError, match="does not record 'train_accuracy' for .* so it has no target "
                                        "'generalization_gap'"):
        load_bench_data(tmp_path, "no-train", target="generalization_gap")
    with pytest.raises(ValueError, match="unknown target 'speed'"):
        load_bench_data(tmp_path, "no-train", target="speed")


def test_tuning_searches_the_same_trials_for_every_model(learnable_zoo: Path) -> None:
    data = load_bench_data(learnable_zoo, "learnable")
    result = run_benchmark(data, BenchRequest(models=["statnn", "statnn_invariant"], seeds=2, epochs=2, tune=True))
    for model in ("statnn", "statnn_invariant"):
        record = result.trials[(model, "all")]
        assert [{k: t[k] for k in ("lr", "weight_decay", "epochs")} for t in record] == tuning_trials(2)
        chosen = result.fits[(model, "all")][0].trial
        assert chosen in tuning_trials(2)
        assert result.untuned[(model, "all")][0].trial == tuning_trials(2)[0]


def test_a_fixed_recipe_that_ignores_epochs_and_tune_says_so() -> None:
    """`--recipe paper --epochs 1` trains the paper's epochs: the run says so before it trains, naming the recipe's
    settings as the registry has them; models without a recipe, or a run that asks for the recipe's own epochs,
    get no note."""
    from nfn_baselines.models.predictors import PREDICTORS

    fixed = [name for name, p in PREDICTORS.items() if p.training]
    assert "transformer_nfn_paper" in fixed
    recipe = PREDICTORS["transformer_nfn_paper"].training
    [note] = fixed_recipe_notes(["statnn", "transformer_nfn_paper", "transformer_nfn_paper"], 1, tune=False)
    assert note.startswith("transformer_nfn_paper trains its fixed recipe") and f"epochs {recipe['epochs']}" in note
    assert fixed_recipe_notes(["statnn", "transformer_nfn"], 1, tune=True) == []
    assert fixed_recipe_notes(["transformer_nfn_paper"], int(recipe["epochs"]), tune=False) == []
    [tuned] = fixed_recipe_notes(["transformer_nfn_paper"], int(recipe["epochs"]), tune=True)
    assert tuned.endswith("whatever --epochs and --tune say")


def test_a_tuned_benchmark_with_trees_and_floors_scores_its_untuned_table(learnable_zoo: Path) -> None:
    data = load_bench_data(learnable_zoo, "learnable", protocol="paper", epoch=2)
    result = run_benchmark(data, BenchRequest(models=["mlp", "lightgbm", "l2_norm"], seeds=1, epochs=2, thresholds=(0.4,),
                                              tune=True))
    tuned, untuned = score(result, (0.4,), resamples=50), score(result, (0.4,), resamples=50, tuned=False)
    for model in ("lightgbm", "l2_norm"):  # not searched: the same fits in both tables
        assert result.untuned[(model, "all")] is result.fits[(model, "all")]
        np.testing.assert_array_equal(tuned.cells[model]["tau"].values, untuned.cells[model]["tau"].values)
    assert np.isfinite(untuned.cells["l2_norm"]["tau"].estimate)
    assert result.untuned[("mlp", "all")][0].trial == tuning_trials(2)[0]
    assert "| lightgbm |" in render_markdown(untuned, result, "learnable")


def test_resplit_and_learning_curve(learnable_zoo: Path) -> None:
    own = load_bench_data(learnable_zoo, "learnable")
    other = load_bench_data(learnable_zoo, "learnable", split_salt="resplit-1")
    assert other.split_salt == "resplit-1"
    runs = lambda data, s: set(data.splits[s].runs.tolist())  # noqa: E731
    assert runs(own, "test") != runs(other, "test")
    assert set().union(*(runs(own, s) for s in own.splits)) == set().union(*(runs(other, s) for s in other.splits))
    for a in other.splits:
        for b in other.splits:
            assert a == b or not runs(other, a) & runs(other, b), "a run in two splits"
    quarter = load_bench_data(learnable_zoo, "learnable", train_runs=0.25)
    assert abs(quarter.splits["train"].run_count - round(0.25 * own.splits["train"].run_count)) <= 1
    assert runs(quarter, "train") <= runs(own, "train") and runs(quarter, "test") == runs(own, "test")


def test_ablations_add_nfn_variants() -> None:
    names = [m.name for m in model_specs(["transformer_nfn"], "components")]
    assert "transformer_nfn[encoder]" in names and "transformer_nfn[embedding+classifier]" in names
    assert "transformer_nfn[c=20,layers=1]" in [m.name for m in model_specs([], "width-depth")]
    with pytest.raises(ValueError, match="unknown model 'resnet'"):
        model_specs(["resnet"])


def test_preprocessing_reaches_every_split(learnable_zoo: Path, tmp_path: Path) -> None:
    from small_transformer_zoo.weights.canonical import canonicalize_params

    raw = load_bench_data(learnable_zoo, "learnable")
    canonical = load_bench_data(learnable_zoo, "learnable", "canonical")
    both = load_bench_data(learnable_zoo, "learnable", "both")
    for split in ("train", "validation", "test"):
        assert torch.allclose(canonical.splits[split].params, canonicalize_params(raw.splits[split].params, SPEC),
                              atol=1e-6)
        assert np.array_equal(canonical.splits[split].target, raw.splits[split].target)
    train = TransformerWeights.from_params(both.splits["train"].params.double(), SPEC)
    assert abs(train.blocks[0].W_A.mean().item()) < 1e-5 and abs(train.blocks[0].W_A.std().item() - 1) < 1e-3
    assert raw.stats is None and canonical.stats is None and both.stats is not None
    with pytest.raises(ValueError, match="unknown preprocessing 'whiten'"):
        load_bench_data(learnable_zoo, "learnable", "whiten")
    assert main(["bench", "--zoo", str(learnable_zoo), "--config", "learnable", "--seeds", "1", "--epochs", "1",
                 "--models", "statnn", "--no-floors", "--preprocess", "standardize", "--out", str(tmp_path), "--resamples",
                 "100"]) == 0
    saved = json.loads((tmp_path / "learnable-bench.json").read_text())
    assert saved["data"]["preprocess"] == "standardize" and "blocks.0.W_A" in saved["data"]["weight_stats"]["scale"]


@pytest.mark.parametrize("argv, message", [
    (["--seeds", "0"], "--seeds: 0 must be at least 1"),
    (["--epochs", "0"], "--epochs: 0 must be at least 1"),
    (["--thresholds", "2"], "--thresholds: 2 must be greater than 0 and less than 1"),
    (["--train-runs", "0"], "--train-runs: 0 must be greater than 0 and at most 1"),
    (["--resamples", "10"], "--resamples: 10 must be at least 100"),
    (["--where", "epoch=1.5"], "where\\['epoch'\\]: '1.5' is not an integer"),
])
def test_bench_flags_are_range_checked(learnable_zoo: Path, argv: list[str], message: str,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(learnable_zoo), *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and __import__("re").search(message, err), err


def test_a_split_too_small_is_a_data_problem(learnable_zoo: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(learnable_zoo), "--where", "run_id=r1", "--seeds", "1"]) == 1
    assert "the benchmark needs at least 2 runs in every split" in capsys.readouterr().err


def test_a_bench_request_resolves_its_device_and_counts_its_fits() -> None:
    from nfn_baselines.bench.runs import BenchRequest

    request = BenchRequest(models=["statnn", "l2_norm"], protocol="paper", thresholds=(0.4, 0.6), resplit=1)
    assert request.device == ("cuda" if torch.cuda.is_available() else "cpu")
    assert request.fit_count() == 2 * 3 * 2
    assert BenchRequest(models=["statnn"], ablation="components").fit_count() == 1 + 6
    assert BenchRequest().fit_count() == len(model_specs())


def test_the_floors_join_named_models_unless_left_out() -> None:
    from nfn_baselines.bench.runs import BenchRequest
    from nfn_baselines.models.predictors import floor_predictors

    assert set(floor_predictors()) >= {"l2_norm", "epoch", "hyperparameters", "nearest_run"}
    joined = BenchRequest(models=["statnn", "epoch"], floors=True).models
    assert joined == ["statnn", "epoch", *(f for f in floor_predictors() if f != "epoch")]
    assert BenchRequest(models=["statnn"]).models == ["statnn"]


@pytest.mark.slow
def test_stz_bench_tables_carry_the_floors(learnable_zoo: Path, tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from small_transformer_zoo.cli import main

    common = ["bench", str(learnable_zoo), "--config", "learnable", "--seeds", "1", "--resamples", "100"]
    assert main([*common, "--models", "mlp", "--epochs", "1", "--out", str(tmp_path / "a")]) == 0
    table = capsys.readouterr().out
    assert all(f"| {floor}" in table for floor in ("l2_norm", "epoch", "hyperparameters", "nearest_run"))
    assert main([*common, "--models", "lightgbm", "--no-floors", "--out", str(tmp_path / "b")]) == 0
    table = capsys.readouterr().out
    assert "| lightgbm" in table and "| l2_norm" not in table and "| nearest_run" not in table


@pytest.mark.slow
def test_a_table_says_what_it_cannot_support(learnable_zoo: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A threshold column resting on fewer than 10 test runs is left out of the table, named with its run count in
    a note, and kept in the results JSON flagged `too_few_runs`; a one-seed table says so and has no seed-spread
    column; the best model is not in its own tied list."""
    from small_transformer_zoo import Zoo
    from small_transformer_zoo.cli import main

    test = Zoo.open(learnable_zoo, "learnable").metadata("test").to_pandas()
    best_of_run = test.groupby("run_id")["test_accuracy"].max().sort_values(ascending=False)
    threshold = float(best_of_run.iloc[4])
    runs = int((best_of_run >= threshold).sum())
    assert runs < 10
    assert main(["bench", str(learnable_zoo), "--config", "learnable", "--models", "lightgbm", "statnn",
                 "--no-floors", "--seeds", "1", "--resamples", "100", "--thresholds", repr(threshold),
                 "--out", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    title = f"tau (acc >= {threshold:.6g})"
    note = re.search(r"Not shown, resting on fewer than 10 test runs: (.+) \(in the results JSON\)\.", table)
    assert note and f"{title} ({runs})" in note.group(1)
    assert not any(title in line for line in table.splitlines() if line.startswith("| model"))
    saved = json.loads((tmp_path / "learnable-bench.json").read_text())
    cells = [model["columns"][f"tau@{threshold:.6g}"] for model in saved["models"].values()]
    assert all(cell["too_few_runs"] and cell["runs"] == runs for cell in cells)
    assert "1 seed," in table and "mean over seeds" not in table and "seed sd" not in table
    best = re.search(r"Best: (\w+); tied with it \(paired interval of the difference holds 0\): ([^.]+)\.", table)
    assert best and best.group(1) not in best.group(2).split(", ")


@pytest.mark.slow
def test_progress_counts_fits_follows_every_phase_and_estimates_from_calibrated_costs(learnable_zoo: Path,
                                                                                       tmp_path: Path) -> None:
    """The run's bar counts fits; the inner one follows a neural fit's epochs, a feature pass, a tree's boosting
    rounds and a forest's trees; the time left comes from the fits' expected costs at the rates measured so far;
    in a log there are no bars, one plain line per fit."""
    import io

    from nfn_baselines.bench.progress import BenchProgress
    from small_transformer_zoo import Zoo

    request = BenchRequest(models=["mlp", "statnn_probe", "lightgbm", "random_forest"], seeds=1, epochs=2,
                           resamples=100)
    log = io.StringIO()
    progress = BenchProgress(request, file=log)
    phases: list[tuple[str, str]] = []
    epoch, phase = progress.epoch, progress.phase
    progress.epoch = lambda m, c: (phases.append((m, "epochs")), epoch(m, c))
    progress.phase = lambda m, c, what, done, total: (phases.append((m, what)), phase(m, c, what, done, total))
    run_bench(Zoo.open(learnable_zoo, "learnable"), request, tmp_path, progress=progress)
    progress.close()
    assert {("mlp", "epochs"), ("statnn_probe", "features"), ("lightgbm", "boosting rounds"),
            ("random_forest", "trees")} <= set(phases)
    lines = log.getvalue().splitlines()
    assert len(lines) == len(progress.costs) == 4 and "\x1b" not in log.getvalue() and "\r" not in log.getvalue()
    assert lines[0].startswith("bench: 1/4 fits, mlp on all done (") and lines[-1].endswith("; done")
    assert "about" in lines[1] and progress.seconds_left() == 0.0


def test_the_time_left_uses_each_models_own_rate_once_measured() -> None:
    import io

    from nfn_baselines.bench.progress import BenchProgress

    progress = BenchProgress(BenchRequest(models=["mlp", "xgboost"], seeds=1), file=io.StringIO(), disable=True)
    progress.plan([("mlp", "neural", "all", 100.0), ("xgboost", "tree", "all", 1000.0),
                   ("mlp", "neural", ">=0.4", 50.0), ("xgboost", "tree", ">=0.4", 500.0)])
    assert progress.seconds_left() is None
    progress.done("mlp", "all", 10.0)  # 0.1 s per unit: the run's rate for the trees, too
    assert progress.seconds_left() == pytest.approx(50 * 0.1 + 1500 * 0.1)
    progress.done("xgboost", "all", 400.0)  # the trees' own rate, 0.4 s per unit
    assert progress.seconds_left() == pytest.approx(50 * 0.1 + 500 * 0.4)
    progress.done("mlp", ">=0.4", 0.0, resumed=True)  # read back: counts, calibrates nothing
    assert progress.seconds_left() == pytest.approx(500 * 0.4)


def test_the_component_ablation_follows_the_components_a_zoo_stores(tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A text checkpoint holds no embedding (frozen, stored once per zoo): its ablation is encoder and classifier
    alone, and an NFN asked to read the embedding only is a clear error, not an empty concatenation."""
    from nfn_baselines.models.model import TransformerNFN
    from small_transformer_zoo.format.architecture import text_spec
    from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

    text = text_spec(vocab_size=30, max_length=6)
    names = lambda spec: [m.name for m in model_specs(["transformer_nfn"], "components", spec)]  # noqa: E731
    assert names(text) == ["transformer_nfn", "transformer_nfn[encoder]", "transformer_nfn[classifier]"]
    assert names(SPEC) == names(None) and len(names(SPEC)) == 1 + 6
    assert BenchRequest(models=["statnn"], ablation="components").fit_count(text) == 1 + 2
    with pytest.raises(ValueError, match="a text checkpoint holds no weights of components \\['embedding'\\]"):
        TransformerNFN(text, components=("embedding",))
    write_synthetic_zoo(tmp_path, "words", runs=24, spec=text, register=False)
    assert main(["bench", str(tmp_path), "--config", "words", "--protocol", "paper", "--epoch", "10", "--seeds", "1",
                 "--epochs", "1", "--models", "transformer_nfn", "--no-floors", "--ablation", "components",
                 "--thresholds", "--out", str(tmp_path / "out")]) == 0
    table = capsys.readouterr().out
    assert "| transformer_nfn[encoder] |" in table and "| transformer_nfn[classifier] |" in table
    assert "embedding" not in table.split("| model |")[1]
