"""The benchmark protocol (docs/design.md section 10): every model on the same splits and seeds, model selection on
validation only, predictions of every split kept for scoring (`report`).

For each condition of the data's protocol (`bench_data`) and each model: tree and floor models are fitted per
seed (once when they do not depend on the seed); neural models are trained per seed and, with `tune`, per trial
of one small declared search (`tuning_trials`), the trial with the best mean validation score over seeds kept.
Models of one small architecture train their seeds and trials together as one batched model
(`train.train_predictors`); Transformer-NFN, whose layers keep a CPU busy at any batch size, trains them one after
another there and together on a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from small_transformer_zoo.format.architecture import COMPONENTS

from ..models.fitting import FitRequest
from ..models.metrics import DEFAULT_THRESHOLDS
from ..models.predictors import Predictor, default_predictors, get_predictor
from ..models.train import TrainConfig, predict_prepared, prepare, train_predictors, validation_score
from .data import BenchData, Condition
from .resume import Fit, FitStore

COMPONENT_ABLATION = (("encoder",), ("embedding",), ("classifier",), ("encoder", "embedding"),
                      ("encoder", "classifier"), ("embedding", "classifier"), COMPONENTS)
WIDTH_DEPTH_ABLATION = ((5, 1), (10, 1), (20, 1), (10, 2))
SPLITS = ("train", "validation", "test")
# Predictors whose copies train faster as one batched model on a CPU (benchmarks/bench_predictor_training.py:
# about 5x for both STATNNs; the MLP, whose first layer reads all 18,506 weights, trains slower batched).
BATCHED_ON_CPU = ("statnn", "statnn_invariant", "statnn_probe")


@dataclass
class ModelSpec:
    """One row of the table: a registered predictor (`nfn_baselines.predictors`) and the settings it overrides."""

    name: str
    predictor: str
    settings: dict[str, Any] = field(default_factory=dict)


@dataclass
class BenchResult:
    data: BenchData
    conditions: list[Condition]
    seeds: list[int]
    fits: dict[tuple[str, str], list[Fit]] = field(default_factory=dict)       # (model, condition) -> per seed
    untuned: dict[tuple[str, str], list[Fit]] = field(default_factory=dict)    # the default trial, when tuned
    trials: dict[tuple[str, str], list[dict[str, Any]]] = field(default_factory=dict)
    models: list[str] = field(default_factory=list)
    specs: dict[str, str] = field(default_factory=dict)                         # model -> registered predictor
    skipped: dict[str, str] = field(default_factory=dict)                       # condition -> why not trained
    seconds: dict[tuple[str, str], float] = field(default_factory=dict)         # training time, resumed ones too
    resumed: int = 0                                                            # (model, condition)s from disk


def model_specs(models: Sequence[str] | None = None, ablation: str | None = None) -> list[ModelSpec]:
    """Rows of the table: the named predictors (default: every default one), then an ablation's NFN variants."""
    names = default_predictors() if models is None else list(models)
    out = [ModelSpec(get_predictor(m).name, m) for m in names]
    if ablation == "components":
        out += [ModelSpec(f"transformer_nfn[{'+'.join(c)}]", "transformer_nfn", {"components": c})
                for c in COMPONENT_ABLATION if c != COMPONENTS]
    elif ablation == "width-depth":
        out += [ModelSpec(f"transformer_nfn[c={c},layers={n}]", "transformer_nfn", {"channels": c, "layers": n})
                for c, n in WIDTH_DEPTH_ABLATION if (c, n) != (10, 1)]
    elif ablation is not None:
        raise ValueError(f"unknown ablation {ablation!r}; choose 'components' or 'width-depth'")
    return out


def expected_epochs(model: ModelSpec, epochs: int, seeds: int, tune: bool) -> int:
    """The network-epochs one (model, condition) fit trains at most (early stopping may end it sooner): what the
    progress of a benchmark is measured in. A tree or floor counts as one per seed it fits."""
    predictor = get_predictor(model.predictor)
    if predictor.kind != "neural":
        return seeds if predictor.seeded else 1
    trials = tuning_trials(epochs) if tune and not predictor.training else tuning_trials(epochs)[:1]
    per = [int(predictor.training.get("epochs", t["epochs"])) for t in trials]
    return sum(per) * seeds


def tuning_trials(epochs: int) -> list[dict[str, Any]]:
    """The declared search of `--tune`, the same for every neural model: learning rate, weight decay and epochs.
    The first trial is the untuned default."""
    return [{"lr": 1e-3, "weight_decay": 0.0, "epochs": epochs},
            {"lr": 3e-4, "weight_decay": 0.0, "epochs": epochs},
            {"lr": 3e-3, "weight_decay": 1e-4, "epochs": epochs},
            {"lr": 1e-3, "weight_decay": 1e-2, "epochs": max(1, epochs // 2)}]


def run_benchmark(data: BenchData, models: list[ModelSpec], seeds: Sequence[int], epochs: int,
                  thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
                  on_done: Callable[[str, str, int], None] | None = None, device: str = "cpu", n_jobs: int = 1,
                  tune: bool = False, settings: dict[str, Any] | None = None,
                  store: FitStore | None = None,
                  on_epoch: Callable[[str, str], None] | None = None) -> BenchResult:
    """Train and predict every model on every condition and seed. `settings` override every neural model's
    training settings (`head_dropout`, `patience`, `weight_decay`, ...) and model settings alike. With a `store`
    (`bench_resume`), a (model, condition) it holds is read back instead of trained, and every one trained is
    kept there. `on_epoch(model, condition)`: one epoch of one network of a neural fit done."""
    if not seeds:
        raise ValueError("the benchmark needs at least one seed")
    result = BenchResult(data, data.conditions(thresholds), list(seeds), models=[m.name for m in models],
                         specs={m.name: m.predictor for m in models})
    trials = tuning_trials(epochs) if tune else tuning_trials(epochs)[:1]
    for condition in result.conditions:
        if (shortfall := condition.shortfall()) is not None:
            result.skipped[condition.name] = shortfall
        rows = {s: len(condition.splits[s]) for s in SPLITS}
        resumable = store is not None and shortfall is None
        for model in models:
            key = (model.name, condition.name)
            stored = store.load(data.split_salt, *key, rows, len(seeds)) if resumable else None
            if stored is not None:
                result.fits[key], result.seconds[key] = stored.fits, stored.seconds
                result.resumed += 1
                if tune:
                    result.untuned[key] = stored.untuned if stored.untuned is not None else stored.fits
                    if stored.trials is not None:
                        result.trials[key] = stored.trials
            else:
                started = time.perf_counter()
                tick = (lambda _, key=key: on_epoch(*key)) if on_epoch else None
                _fit_model(result, model, condition, shortfall, trials, tune, device, n_jobs, settings or {}, tick)
                result.seconds[key] = time.perf_counter() - started
                if resumable:
                    untuned = result.untuned.get(key)  # the chosen fits themselves for trees and floors
                    store.save(data.split_salt, *key, fits=result.fits[key],
                               untuned=None if untuned is result.fits[key] else untuned,
                               trials=result.trials.get(key), seconds=result.seconds[key])
            if on_done:
                on_done(model.name, condition.name, len(seeds))
    return result


def _fit_model(result: BenchResult, model: ModelSpec, condition: Condition, shortfall: str | None,
               trials: list[dict[str, Any]], tune: bool, device: str, n_jobs: int,
               settings: dict[str, Any], progress: Callable[[dict[str, float]], None] | None = None) -> None:
    """Train (or, for a condition too small, mark undefined) one model on one condition, into `result`."""
    data, seeds, key = result.data, result.seeds, (model.name, condition.name)
    predictor = get_predictor(model.predictor)
    if shortfall is not None:
        result.fits[key] = _undefined_fits(condition, data, seeds)
        if tune:
            result.untuned[key] = result.fits[key]
    elif predictor.kind == "neural":
        if predictor.training:  # a fixed recipe: the search has nothing to vary
            trials = [{**trials[0], **{k: v for k, v in predictor.training.items() if k in trials[0]}}]
        per_trial = _train_neural(predictor, model, condition, data, trials, seeds, device, settings, progress)
        scores = [float(np.nanmean([f.validation_score for f in fits])) for fits in per_trial]
        best = int(np.nanargmax(scores)) if np.isfinite(scores).any() else 0
        result.fits[key] = per_trial[best]
        if tune:
            result.untuned[key] = per_trial[0]
            result.trials[key] = [{**t, "mean_validation_score": s} for t, s in zip(trials, scores)]
    else:
        result.fits[key] = _fit_table_model(predictor, model, condition, data, seeds, n_jobs)
        if tune:  # trees and floors keep their settings: tuned and untuned are the same fits
            result.untuned[key] = result.fits[key]


def _fit_table_model(predictor: Predictor, model: ModelSpec, condition: Condition, data: BenchData,
                     seeds: list[int], n_jobs: int) -> list[Fit]:
    """Tree and floor models: one fit per seed, or one for all seeds when the predictor ignores its seed."""
    if (data.target.kind == "classification" and not predictor.classifies) or \
            set(predictor.reads) & set(data.target.columns):  # not defined: it would read the target itself
        return _undefined_fits(condition, data, seeds)
    fits: list[Fit] = []
    for seed in seeds if predictor.seeded else seeds[:1]:
        request = FitRequest(seed, n_jobs, condition.splits["train"], condition.splits["validation"], data.target,
                             {**predictor.settings, **model.settings})
        fitted = predictor.fit(request)
        predictions = {s: np.asarray(fitted.predict(condition.splits[s]), dtype=float) for s in SPLITS}
        fits.append(Fit(predictions, {"seeded": predictor.seeded},
                        validation_score(predictions["validation"], condition.splits["validation"].target,
                                         data.target.loss)))
    return fits if predictor.seeded else fits * len(seeds)


def _undefined_fits(condition: Condition, data: BenchData, seeds: list[int]) -> list[Fit]:
    """NaN predictions for every split and seed: a model not defined for this target, or a condition too small."""
    nan = {s: np.full((len(condition.splits[s]), data.target.outputs), np.nan) for s in SPLITS}
    return [Fit(nan, {}, float("nan")) for _ in seeds]


def _train_neural(predictor: Predictor, model: ModelSpec, condition: Condition, data: BenchData,
                  trials: list[dict[str, Any]], seeds: list[int], device: str,
                  overrides: dict[str, Any], progress: Callable[[dict[str, float]], None] | None = None
                  ) -> list[list[Fit]]:
    """Every (trial, seed) of a neural model: per trial, the fits of every seed."""
    model_keys = set(predictor.settings)
    model_settings = {**predictor.settings, **model.settings,
                      **{k: v for k, v in overrides.items() if k in model_keys}}
    train_overrides = {k: v for k, v in overrides.items() if k not in model_keys}
    jobs = [(t, s) for t in range(len(trials)) for s in seeds]
    nets, configs = [], []
    for trial, seed in jobs:
        with torch.random.fork_rng(devices=[]):  # each model's initialisation draws from its own seed
            torch.manual_seed(seed)
            nets.append(predictor.build(data.spec, model_settings, data.target.outputs))
        epochs = trials[trial]["epochs"]
        configs.append(TrainConfig(**{"epochs": epochs, "warmup_epochs": max(1, epochs // 10), "seed": seed,
                                      "device": device, "lr": trials[trial]["lr"],
                                      "weight_decay": trials[trial]["weight_decay"], **predictor.training,
                                      **train_overrides}))
    together = torch.device(device).type != "cpu" or model.predictor in BATCHED_ON_CPU
    groups = [list(range(len(jobs)))] if together else [[i] for i in range(len(jobs))]
    train, validation = condition.splits["train"], condition.splits["validation"]
    labels = (torch.from_numpy(train.target), torch.from_numpy(validation.target))
    prepared = {s: prepare(nets[0], condition.splits[s].params) for s in SPLITS}  # the same for every (trial, seed)
    fits: dict[int, Fit] = {}
    for group in groups:
        results = train_predictors([nets[i] for i in group], data.spec, (train.params, labels[0]),
                                   (validation.params, labels[1]), [configs[i] for i in group], progress,
                                   loss=data.target.loss, prepared=(prepared["train"], prepared["validation"]))
        for i, trained in zip(group, results):
            predictions = {s: predict_prepared(trained.model, prepared[s], data.spec, data.target.loss, trained.scale)
                           for s in SPLITS}
            fits[i] = Fit(predictions, trials[jobs[i][0]], trained.best_validation_score, trained.best_epoch)
    return [[fits[jobs.index((t, s))] for s in seeds] for t in range(len(trials))]
