"""Baselines and the benchmark protocol, on a small synthetic zoo whose accuracy is a function of its weights."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from nfn_baselines.baselines import FlatPredictor, statistics
from nfn_baselines.benchmark import (load_bench_data, model_specs, plot_predictions, render_markdown, run_benchmark,
                                     summarize)
from nfn_baselines.cli import register  # noqa: F401  (the subcommand module imports cleanly)
from nfn_baselines.metrics import scores
from small_transformer_zoo import ZooWriter, mnist_spec
from small_transformer_zoo.cli import main
from small_transformer_zoo.weights.symmetry import sample_group_element
from small_transformer_zoo.weights.weight_space import TransformerWeights

SPEC = mnist_spec()


@pytest.fixture(scope="module")
def learnable_zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Accuracy = a smooth function of one shift added to the last block's b_B (an invariant the encoder sees) and
    to the classifier's last bias (which the flat models see): every model has signal to find."""
    root = tmp_path_factory.mktemp("bench")
    rng = np.random.default_rng(0)
    b_b = next(p for p in SPEC.parameters() if p.name == f"blocks.{SPEC.num_blocks - 1}.mlp.fc2.bias")
    with ZooWriter(root, "learnable", SPEC, register=False) as writer:
        for run in range(300):
            shift = rng.uniform(-1, 1)
            params = rng.normal(0, 0.2, SPEC.n_params).astype(np.float32)
            params[-10:] += shift
            params[b_b.offset : b_b.offset + b_b.numel] += shift
            writer.add(params, {"run_id": f"r{run}", "epoch": 1, "test_accuracy": float(1 / (1 + np.exp(-3 * shift)))})
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
        if mode == "mlp":
            assert not torch.allclose(model(g.act(weights)), out, atol=1e-6)
    with pytest.raises(ValueError, match="mode"):
        FlatPredictor(SPEC, mode="cnn")


def test_scores_and_thresholds() -> None:
    true = np.array([0.1, 0.3, 0.5, 0.7, 0.9])
    result = scores(true * 2, true)
    assert result["tau"] == pytest.approx(1.0) and result["tau@0.4"] == pytest.approx(1.0)
    assert result["n@0.4"] == 3 and result["n@0.8"] == 1 and np.isnan(result["tau@0.8"])
    assert scores(true, true)["r2"] == pytest.approx(1.0) and scores(true, true)["l1"] == 0.0


def test_benchmark_table_ranks_models_on_a_learnable_zoo(learnable_zoo: Path, tmp_path: Path) -> None:
    data = load_bench_data(learnable_zoo, "learnable")
    models = model_specs(["transformer_nfn", "mlp", "statnn", "xgboost", "lightgbm", "random_forest"])
    result = run_benchmark(data, models, seeds=[0], epochs=6)
    summary = summarize(result)
    assert set(summary) == {m.name for m in models}
    for name in ("transformer_nfn", "xgboost", "lightgbm", "random_forest"):
        assert summary[name]["tau"]["mean"] > 0.5, (name, summary[name]["tau"])
    markdown = render_markdown(summary, (0.2, 0.4, 0.6, 0.8), 1, "learnable")
    assert "| transformer_nfn |" in markdown and "±" in markdown
    assert plot_predictions(result, tmp_path / "fig.png", "learnable").stat().st_size > 10_000


def test_ablations_add_nfn_variants() -> None:
    names = [m.name for m in model_specs(["transformer_nfn"], "components")]
    assert "transformer_nfn[encoder]" in names and "transformer_nfn[embedding+classifier]" in names
    assert "transformer_nfn[c=20,layers=1]" in [m.name for m in model_specs([], "width-depth")]
    with pytest.raises(ValueError, match="unknown model 'resnet'"):
        model_specs(["resnet"])


def test_stz_bench_writes_json_markdown_and_plot(learnable_zoo: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--zoo", str(learnable_zoo), "--config", "learnable", "--seeds", "1", "--epochs", "2",
                 "--models", "mlp", "lightgbm", "--out", str(tmp_path), "--leaderboard", str(tmp_path / "b.json")]) == 0
    out = capsys.readouterr().out
    assert "| mlp |" in out and "| lightgbm |" in out
    saved = json.loads((tmp_path / "learnable-bench.json").read_text())
    assert set(saved["summary"]) == {"mlp", "lightgbm"} and saved["seeds"] == [0]
    assert (tmp_path / "learnable-predicted-vs-true.png").is_file()
    from nfn_baselines.leaderboard import load_leaderboard

    board = {e["name"]: e["metrics"]["tau"] for e in load_leaderboard(tmp_path / "b.json")}
    assert board.keys() == {"mlp", "lightgbm"}
    assert board["lightgbm"] == pytest.approx(saved["per_seed"]["lightgbm"][0]["tau"])


def test_preprocessing_reaches_every_split(learnable_zoo: Path, tmp_path: Path) -> None:
    from small_transformer_zoo.weights.canonical import canonicalize_params

    raw = load_bench_data(learnable_zoo, "learnable")
    canonical = load_bench_data(learnable_zoo, "learnable", "canonical")
    both = load_bench_data(learnable_zoo, "learnable", "both")
    for split in ("train", "validation", "test"):
        assert torch.allclose(canonical.splits[split][0], canonicalize_params(raw.splits[split][0], SPEC), atol=1e-6)
        assert torch.equal(canonical.splits[split][1], raw.splits[split][1])
    train = TransformerWeights.from_params(both.splits["train"][0].double(), SPEC)
    assert abs(train.blocks[0].W_A.mean().item()) < 1e-5 and abs(train.blocks[0].W_A.std().item() - 1) < 1e-3
    assert raw.stats is None and canonical.stats is None and both.stats is not None
    with pytest.raises(ValueError, match="unknown preprocessing 'whiten'"):
        load_bench_data(learnable_zoo, "learnable", "whiten")
    assert main(["bench", "--zoo", str(learnable_zoo), "--config", "learnable", "--seeds", "1", "--epochs", "1",
                 "--models", "statnn", "--preprocess", "standardize", "--out", str(tmp_path)]) == 0
    saved = json.loads((tmp_path / "learnable-bench.json").read_text())
    assert saved["preprocess"] == "standardize" and "blocks.0.W_A" in saved["weight_stats"]["scale"]
