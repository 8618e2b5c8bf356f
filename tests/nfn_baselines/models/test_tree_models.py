"""XGBoost with its bin boundaries sketched on a sample of the training rows: the trees split only on the sample's
boundaries, and splits within the limit are fitted as XGBoost fits them. The boosted models report the rounds
early stopping kept."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from xgboost import QuantileDMatrix, XGBClassifier, XGBRegressor

from nfn_baselines.models.baselines import SKETCH_ROWS, fit_tree, sampled_sketch, sketch_rows, tree_model

SETTINGS = dict(n_estimators=6, max_bin=16, tree_method="hist", n_jobs=1)


def table(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    generator = np.random.default_rng(seed)
    x = generator.normal(size=(rows, 5)).astype(np.float32)
    return x, x[:, 0] + 0.5 * x[:, 1] ** 2 + 0.1 * generator.normal(size=rows)


def thresholds(model: object) -> dict[int, np.ndarray]:
    """Each feature's split values over all trees."""
    frame = model.get_booster().trees_to_dataframe()
    splits = frame[frame.Feature != "Leaf"]
    return {int(f.lstrip("f")): group.Split.to_numpy(np.float32) for f, group in splits.groupby("Feature")}


def cuts(x: np.ndarray) -> list[np.ndarray]:
    pointers, values = QuantileDMatrix(x, max_bin=SETTINGS["max_bin"]).get_quantile_cut()
    return [values[pointers[f]:pointers[f + 1]] for f in range(x.shape[1])]


@settings(max_examples=40, deadline=None)
@given(rows=st.integers(0, 3000), limit=st.integers(1, 3000), seed=st.integers(0, 2**32 - 1))
def test_sketch_rows_are_a_sorted_seeded_sample(rows: int, limit: int, seed: int) -> None:
    drawn = sketch_rows(rows, seed, limit)
    assert len(drawn) == min(rows, limit)
    assert np.all(np.diff(drawn) > 0) and (len(drawn) == 0 or (drawn[0] >= 0 and drawn[-1] < rows))
    assert np.array_equal(drawn, sketch_rows(rows, seed, limit))


@pytest.mark.parametrize("seed", [0, 7])
def test_splits_above_the_limit_use_only_the_sample_boundaries(seed: int) -> None:
    x, y = table(600, seed)
    valid_x, valid_y = table(150, seed + 1)
    model = sampled_sketch(XGBRegressor, limit=64)(random_state=seed, **SETTINGS)
    model.fit(x, y, eval_set=[(valid_x, valid_y)], verbose=False)
    sample, full = cuts(x[sketch_rows(len(x), seed, 64)]), cuts(x)
    used = thresholds(model)
    assert used, "the trees made no split"
    assert all(np.isin(values, sample[f]).all() for f, values in used.items())
    assert not all(np.isin(values, full[f]).all() for f, values in used.items())
    plain = XGBRegressor(random_state=seed, **SETTINGS).fit(x, y)
    assert not np.allclose(model.predict(valid_x), plain.predict(valid_x))


@pytest.mark.parametrize("rows", [40, 64])
def test_splits_within_the_limit_are_fitted_as_xgboost_fits_them(rows: int) -> None:
    x, y = table(rows, 3)
    valid_x, valid_y = table(30, 4)
    sampled = sampled_sketch(XGBRegressor, limit=64)(random_state=1, early_stopping_rounds=3, **SETTINGS)
    plain = XGBRegressor(random_state=1, early_stopping_rounds=3, **SETTINGS)
    for model in (sampled, plain):
        model.fit(x, y, eval_set=[(valid_x, valid_y)], verbose=False)
    assert np.array_equal(sampled.predict(valid_x), plain.predict(valid_x))


def test_the_classifier_is_sketched_on_the_sample_too() -> None:
    x, y = table(500, 11)
    labels = np.digitize(y, np.quantile(y, [1 / 3, 2 / 3]))
    model = sampled_sketch(XGBClassifier, limit=80)(random_state=2, **SETTINGS).fit(x, labels)
    sample = cuts(x[sketch_rows(len(x), 2, 80)])
    used = thresholds(model)
    assert used and all(np.isin(values, sample[f]).all() for f, values in used.items())
    probabilities = model.predict_proba(x)
    assert probabilities.shape == (500, 3) and np.allclose(probabilities.sum(1), 1, atol=1e-5)


@pytest.mark.parametrize("classification", [False, True])
def test_the_benchmark_models_sketch_on_at_most_sketch_rows(classification: bool) -> None:
    x, y = table(SKETCH_ROWS + 300, 5)
    target = np.digitize(y, np.quantile(y, [0.5])) if classification else y
    model = tree_model("xgboost", seed=5, classification=classification)
    model.set_params(n_estimators=3, max_bin=SETTINGS["max_bin"], early_stopping_rounds=None).fit(x, target)
    sample = cuts(x[sketch_rows(len(x), 5)])
    used = thresholds(model)
    assert used and all(np.isin(values, sample[f]).all() for f, values in used.items())


@pytest.mark.parametrize("name", ["xgboost", "lightgbm", "random_forest"])
def test_the_rounds_early_stopping_kept_are_reported(name: str) -> None:
    x, y = table(400, 21)
    noise = np.random.default_rng(22).normal(size=100)  # a validation target the weights do not predict
    train = SimpleNamespace(params=torch.from_numpy(x), target=y)
    validation = SimpleNamespace(params=torch.from_numpy(table(100, 23)[0]), target=noise)
    model = tree_model(name, seed=0, n_estimators=200)
    if name != "random_forest":
        model.set_params(min_child_weight=1)
    fitted = fit_tree(model, name, train, validation)
    if name == "xgboost":
        assert fitted.rounds == model.get_booster().num_boosted_rounds() - 30  # it stopped 30 rounds after
    elif name == "lightgbm":
        assert fitted.rounds == model.best_iteration_ == model.booster_.current_iteration()  # kept, the rest cut
    else:
        assert fitted.rounds is None
    if fitted.rounds is not None:
        assert 1 <= fitted.rounds < 200


def test_a_sketch_of_no_rows_is_refused() -> None:
    with pytest.raises(ValueError, match="limit=0"):
        sampled_sketch(XGBRegressor, limit=0)
