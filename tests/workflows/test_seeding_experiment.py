"""The seeding experiment's tables from stored scores: a model shown only where it was trained, the shared zoos
pooled, and a gap compared between zoos without pairing."""

import argparse

import numpy as np
import pytest

from tests.helpers import benchmark_script


@pytest.fixture(scope="module")
def experiment():
    return benchmark_script("seeding_experiment")


def scores(rng: np.random.Generator, means: dict[str, float], runs: int = 40) -> dict:
    quality = {"epoch": 6, "runs": 480, "q1": 0.1, "median": 0.3, "q3": 0.5, "below_cutoff": 0.3, "above_half": 0.25}
    return {"runs": runs, "within": 0.0, "quality": quality,
            "models": {m: {"estimate": mean, "values": (mean + 0.02 * rng.standard_normal(1000)).tolist(),
                           "seconds": 1.0} for m, mean in means.items()}}


def test_tables_show_untrained_models_pool_shared_zoos_and_compare_gaps_between_zoos(experiment) -> None:
    rng = np.random.default_rng(0)
    table = {("per-run", "run"): scores(rng, {"transformer_nfn": 0.45, "transformer_nfn_paper": 0.44, "statnn": 0.75,
                                              "hyperparameters": 0.55}),
             ("per-run", "interfaces"): scores(rng, {"transformer_nfn": 0.46, "statnn": 0.75,
                                                     "hyperparameters": 0.55})}
    for config, nfn in (("shared-a", 0.80), ("shared-b", 0.84)):
        table[(config, "run")] = scores(rng, {"transformer_nfn": nfn, "statnn": 0.76, "hyperparameters": 0.6})
        table[(config, "interfaces")] = scores(rng, {"transformer_nfn": nfn - 0.15, "statnn": 0.76,
                                                     "hyperparameters": 0.6})
    text = experiment.render(table, ["shared-a", "shared-b"], "per-run")
    paper_row = next(line for line in text.splitlines() if line.startswith("| transformer_nfn_paper, tau"))
    assert paper_row.endswith("| not trained |"), paper_row
    assert "## shared, pooled over 2 base seeds" in text and "| test runs | 80 | 80 |" in text
    between = [line for line in text.splitlines() if "on the shared zoos minus on the per-run zoo" in line]
    run_gap = next(line for line in between if line.startswith("- `run`, (transformer_nfn minus statnn)"))
    assert "+0.360 [" in run_gap and run_gap.endswith("decided")
    gap = experiment.gap_between([table[("shared-a", "run")], table[("shared-b", "run")]],
                                 [table[("per-run", "run")]], "statnn", "hyperparameters")
    assert gap["estimate"] == pytest.approx((0.76 - 0.6) - (0.75 - 0.55))
    assert gap["low"] < gap["estimate"] < gap["high"]



def test_a_scored_condition_trains_again_only_for_a_model_it_lacks_and_keeps_what_it_holds(experiment) -> None:
    def args(models: list[str], **flags: bool):
        return argparse.Namespace(**{"models": models, "paper_recipe": False, "render": False,
                                                "fresh": False, "conditions": ["run"], **flags})

    stored = scores(np.random.default_rng(0), {"transformer_nfn": 0.8, "statnn": 0.7})
    train = experiment.models_to_train
    assert train(stored, "run", args(["statnn"])) == []
    assert train(stored, "run", args(["statnn_probe", "statnn"])) == ["transformer_nfn", "statnn", "statnn_probe"]
    assert train(None, "run", args(["statnn_probe"])) == ["statnn_probe"]
    assert train(stored, "interfaces", args(["statnn_probe"])) == []
    assert train(stored, "run", args(["statnn_probe"], render=True)) == []
    assert train(stored, "run", args(["statnn"], fresh=True)) == ["statnn"]
