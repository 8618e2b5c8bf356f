"""The regime experiment's 2 x 2 from stored scores: a difference per zoo, paired inside it, and the regime's and
the seeding's effects on it, unpaired between zoos."""

import json
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import benchmark_script


@pytest.fixture(scope="module")
def experiment():
    return benchmark_script("regime_experiment")


def scores(rng: np.random.Generator, config: str, means: dict[str, float], runs: int = 60) -> dict:
    return {"config": config, "runs": runs, "within": 0.0,
            "models": {m: {"estimate": mean, "values": (mean + 0.02 * rng.standard_normal(1000)).tolist(),
                           "seconds": 1.0} for m, mean in means.items()}}


def write_cells(tmp_path: Path, cells: dict[tuple[str, str], dict]) -> list[list[str]]:
    specs = []
    for (regime, seeding), value in cells.items():
        folder = tmp_path / regime / seeding
        folder.mkdir(parents=True)
        (folder / "scores.json").write_text(json.dumps(value))
        specs.append([regime, seeding, str(folder)])
    return specs


def test_the_two_by_two_pairs_inside_a_zoo_and_compares_zoos_unpaired(experiment, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    written = {("families", "per-run"): scores(rng, "f", {"transformer_nfn": 0.47, "statnn": 0.74}),
               ("families", "shared"): scores(rng, "fs", {"transformer_nfn": 0.80, "statnn": 0.79}),
               ("trained", "per-run"): scores(rng, "t", {"transformer_nfn": 0.50, "statnn": 0.55}),
               ("trained", "shared"): scores(rng, "ts", {"transformer_nfn": 0.60, "statnn": 0.60, "probegen": 0.7})}
    text = experiment.difference_tables(experiment.read_cells(write_cells(tmp_path, written)))
    lines = text.splitlines()
    assert "## transformer_nfn minus statnn (paired inside each zoo)" in lines
    per_run = next(line for line in lines if line.startswith("| per-run | -0.270 ["))
    cells = per_run.split(" | ")
    assert cells[2].startswith("-0.050 [") and cells[3].startswith("+0.220 [") and cells[3].endswith("decided |")
    shared = next(line for line in lines if line.startswith("| shared | +0.010 ["))
    assert "tied" in shared.split(" | ")[1] and "not decided" in shared.split(" | ")[3]
    seeding = next(line for line in lines if line.startswith("shared minus per-run, per regime"))
    assert "families +0.280 [" in seeding and "trained +0.050 [" in seeding
    probegen = text[text.index("## probegen minus statnn"):]
    assert "| per-run | - | - | - |" in probegen and "+0.100 [" in probegen


def test_a_cell_given_twice_takes_both_folders_models_of_one_zoo_only(experiment, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    first = write_cells(tmp_path / "one", {("trained", "per-run"): scores(rng, "t", {"statnn": 0.5})})
    second = write_cells(tmp_path / "two", {("trained", "per-run"): scores(rng, "t", {"probegen": 0.6})})
    cells = experiment.read_cells(first + second)
    assert set(cells[("trained", "per-run")]["models"]) == {"statnn", "probegen"}
    other = write_cells(tmp_path / "three", {("trained", "per-run"): scores(rng, "other", {"probegen": 0.6})})
    with pytest.raises(SystemExit, match="zoo 'other' with 60 test runs, but cell trained per-run holds 't'"):
        experiment.read_cells(first + other)
    with pytest.raises(SystemExit, match="no scores here"):
        experiment.read_cells([["trained", "per-run", str(tmp_path)]])


def test_the_plot_draws_every_pair_trained_in_some_zoo(experiment, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    written = {("families", "per-run"): scores(rng, "f", {"transformer_nfn": 0.47, "statnn": 0.74}),
               ("trained", "shared"): scores(rng, "ts", {"transformer_nfn": 0.60, "statnn": 0.60, "probegen": 0.7})}
    path = experiment.plot(experiment.read_cells(write_cells(tmp_path, written)), tmp_path / "figure.png")
    from PIL import Image

    with Image.open(path) as image:
        width, height = image.size
    assert image.format == "PNG" and width > 1.5 * height  # two panels (NFN and ProbeGen against STATNN); one is narrower than tall
