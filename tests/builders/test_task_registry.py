"""A new image task through one module (`tests/color_task.py`, 3x32x32 images): build, load, the NFN and the
benchmark, with nothing else changed; and a new predictor through one registry entry."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.linear_model import Ridge

import tests.color_task  # noqa: F401 - registers the task `color32`, as a task module in builders/tasks would
from builders.grid import PRESETS
from nfn_baselines.models.baselines import FittedTable, flat_weights
from nfn_baselines.bench.data import load_bench_data
from nfn_baselines.bench.benchmark import run_benchmark
from nfn_baselines.bench.request import BenchRequest
from nfn_baselines.models.model import TransformerNFN
from nfn_baselines.models.predictors import PREDICTORS, Predictor, default_predictors, register_predictor
from small_transformer_zoo import Zoo, load_dataset
from small_transformer_zoo.cli import main
from small_transformer_zoo.weights.symmetry import sample_group_element

pytestmark = pytest.mark.slow  # every test here shares the colour zoo, whose build takes about 20 seconds

# The `mini` preset on half its epochs: the runs learn the patterns in 3 (the test below checks it), and the build
# takes half as long.
COLOUR_EPOCHS = 3


@pytest.fixture(scope="module")
def color_zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("color") / "zoo"
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(PRESETS, "mini", replace(PRESETS["mini"], epochs=COLOUR_EPOCHS))
        assert main(["build", "--task", "color32", "--preset", "mini", "--out", str(out), "--no-progress",
                     "--device", "cpu"]) == 0
    return out


def test_a_colour_image_task_builds_and_loads(color_zoo: Path) -> None:
    zoo = Zoo.open(color_zoo, "color32-mini")
    assert (zoo.spec.in_channels, zoo.spec.image_size, zoo.spec.num_classes) == (3, 32, 10)
    assert zoo.verify() == []
    assert zoo.manifest["task"]["description"].startswith("Synthetic 3x32x32")
    assert "`color32`: Synthetic 3x32x32 colour patterns" in (color_zoo / "README.md").read_text()
    splits = load_dataset(color_zoo, "color32-mini")
    assert splits["train"].features["params"].length == zoo.spec.n_params
    row = splits["train"][0]
    assert torch.equal(torch.tensor(row["params"]), zoo.split_weights("train").rows([0])[0])
    accuracy = np.asarray([a for s in zoo.splits for a in zoo.metadata(s).column("test_accuracy").to_pylist()])
    assert accuracy.max() > 0.2  # the runs learn the patterns (chance is 0.1)


def test_the_nfn_reads_the_colour_zoo_invariantly(color_zoo: Path) -> None:
    zoo = Zoo.open(color_zoo, "color32-mini")
    weights, _ = zoo.weight_space("train")
    model = TransformerNFN(zoo.spec).double().eval()
    weights = weights.map(lambda tensor: tensor[:8]).to(torch.float64)  # 8 checkpoints: the suite's memory
    moved = sample_group_element(zoo.spec, torch.Generator().manual_seed(2)).act(weights)
    base = model.forward_logits(weights)
    assert ((model.forward_logits(moved) - base).abs().max() / base.abs().max()).item() < 1e-9


def test_the_benchmark_runs_on_the_colour_zoo(color_zoo: Path, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    # its own process: training the NFN on the colour zoo's larger weights takes about 1 GB the suite should not keep
    done = subprocess.run([str(Path(sys.executable).parent / "stz"), "bench", "--zoo", str(color_zoo), "--config",
                           "color32-mini", "--seeds", "1", "--epochs", "2", "--models", "transformer_nfn", "statnn",
                           "lightgbm", "--no-floors", "--out", str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    out = done.stdout
    assert "| transformer_nfn |" in out and "| lightgbm |" in out


@pytest.fixture
def ridge() -> Predictor:
    predictor = register_predictor(Predictor(
        "ridge", "tree", "ridge regression on the flattened weights", default=False,
        fit=lambda request: FittedTable(Ridge(alpha=request.settings["alpha"]).fit(flat_weights(request.train),
                                                                                   request.train.target), flat_weights),
        settings={"alpha": 10.0}))
    yield predictor
    del PREDICTORS["ridge"]


def test_a_registered_predictor_joins_the_benchmark_and_the_cli(ridge: Predictor, color_zoo: Path,
                                                               capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    assert "ridge" not in default_predictors()
    data = load_bench_data(color_zoo, "color32-mini")
    result = run_benchmark(data, BenchRequest(models=["ridge"], seeds=1, epochs=1))
    predicted = result.fits[("ridge", "all")][0].predictions["test"]
    train, test = data.splits["train"], data.splits["test"]
    expected = Ridge(alpha=10.0).fit(train.params.numpy(), train.target).predict(test.params.numpy())
    np.testing.assert_allclose(np.ravel(predicted), expected, rtol=1e-6)
    assert main(["bench", "--zoo", str(color_zoo), "--config", "color32-mini", "--seeds", "1", "--models", "ridge",
                 "--no-floors", "--out", str(tmp_path)]) == 0
    assert "| ridge |" in capsys.readouterr().out
    with pytest.raises(ValueError, match="already registered"):
        register_predictor(ridge)


def test_training_leaves_torch_global_random_state_alone(color_zoo: Path) -> None:
    data = load_bench_data(color_zoo, "color32-mini")
    torch.manual_seed(99)
    before = torch.random.get_rng_state()
    run_benchmark(data, BenchRequest(models=["mlp"], seeds=1, epochs=1))
    assert torch.equal(torch.random.get_rng_state(), before)
