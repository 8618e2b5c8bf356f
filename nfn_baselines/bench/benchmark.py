"""The benchmark protocol (docs/design.md section 10): every model on the same splits and seeds, model selection on
validation only, predictions of every split kept for scoring (`report`).

For each condition of the data's protocol (`data`) and each model row of the request (`request`): tree and floor models are fitted per
seed (once when they do not depend on the seed); neural models are trained per seed and, with `tune`, per trial
of one small declared search (`tuning_trials`), the trial with the best mean validation score over seeds kept.
Models of one small architecture train their seeds and trials together as one batched model
(`train.train_predictors`); Transformer-NFN, whose layers keep a CPU busy at any batch size, trains them one after
another there and together on a GPU.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..models.fitting import FitRequest
from ..models.predictors import Predictor, get_predictor
from ..models.train import TrainConfig, predict_prepared, prepare, train_predictors, validation_score
from .data import BenchData, Condition
from .request import BenchRequest, ModelSpec, expected_epochs
from .resume import Fit, FitStore

SPLITS = ("train", "validation", "test")
# Predictors whose copies train faster as one batched model on a CPU (benchmarks/bench_predictor_training.py:
# about 5x for both STATNNs; the MLP, whose first layer reads all 18,506 weights, trains slower batched).
BATCHED_ON_CPU = ("statnn", "statnn_invariant", "statnn_probe")


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


def run_benchmark(data: BenchData, request: BenchRequest, store: FitStore | None = None,
                  on_done: Callable[[str, str, int], None] | None = None,
                  on_epoch: Callable[[str, str], None] | None = None, progress: Any = None) -> BenchResult:
    """Train and predict every model row of `request` on every condition of `data` and every seed. The request's
    `settings` override every neural model's training settings (`head_dropout`, `patience`, `weight_decay`, ...)
    and model settings alike. With a `store` (`resume`), a (model, condition) it holds is read back instead of
    trained, and every one trained is kept there. `on_done(model, condition, seeds)`: one fit done;
    `on_epoch(model, condition)`: one epoch of one network of a neural fit done. `progress` (`BenchProgress`) is
    told the plan with each fit's expected cost, every epoch and phase (a feature pass, boosting rounds, a
    forest's trees), and each fit done with its seconds."""
    if request.seeds < 1:
        raise ValueError("the benchmark needs at least one seed")
    models = request.model_rows(data.spec)
    result = BenchResult(data, data.conditions(request.thresholds), request.seed_list(),
                         models=[m.name for m in models], specs={m.name: m.predictor for m in models})
    if progress is not None:
        progress.plan([(m.name, get_predictor(m.predictor).kind, c.name, fit_cost(m, c, request))
                       for c in result.conditions for m in models])
    for condition in result.conditions:
        if (shortfall := condition.shortfall()) is not None:
            result.skipped[condition.name] = shortfall
        rows = {s: len(condition.splits[s]) for s in SPLITS}
        resumable = store is not None and shortfall is None
        for model in models:
            key = (model.name, condition.name)
            stored = store.load(data.split_salt, *key, rows, request.seeds) if resumable else None
            if stored is not None:
                result.fits[key], result.seconds[key] = stored.fits, stored.seconds
                result.resumed += 1
                if request.tune:
                    result.untuned[key] = stored.untuned if stored.untuned is not None else stored.fits
                    if stored.trials is not None:
                        result.trials[key] = stored.trials
            else:
                started = time.perf_counter()

                def tick(_: Any, key: tuple[str, str] = key) -> None:
                    if on_epoch:
                        on_epoch(*key)
                    if progress is not None:
                        progress.epoch(*key)

                def phase(what: str, done: int, total: int, key: tuple[str, str] = key) -> None:
                    if progress is not None:
                        progress.phase(*key, what, done, total)

                _fit_model(result, request, model, condition, shortfall, tick, phase)
                result.seconds[key] = time.perf_counter() - started
                if resumable:
                    untuned = result.untuned.get(key)  # the chosen fits themselves for trees and floors
                    store.save(data.split_salt, *key, fits=result.fits[key],
                               untuned=None if untuned is result.fits[key] else untuned,
                               trials=result.trials.get(key), seconds=result.seconds[key])
            if on_done:
                on_done(model.name, condition.name, request.seeds)
            if progress is not None:
                progress.done(model.name, condition.name, 0.0 if stored is not None else result.seconds[key],
                              resumed=stored is not None)
    return result


NEURAL_PASSES = 2.0  # a neural epoch reads the training rows forward and backward, the validation rows forward
TABLE_COST = {"tree": 30.0, "floor": 0.2}  # a priori cost per training row of a tree or floor fit, in row-epochs


def fit_cost(model: ModelSpec, condition: Condition, request: BenchRequest) -> float:
    """What one (model, condition) fit is expected to cost, in row-epochs of a neural model (a training row read
    forward and backward once): epochs times rows for a neural model, a prior per training row for trees and
    floors. The progress calibrates it as fits finish."""
    predictor = get_predictor(model.predictor)
    rows = len(condition.splits["train"])
    if predictor.kind == "neural":
        epochs = expected_epochs(model, request.epochs, request.seeds, request.tune)
        return epochs * (rows + len(condition.splits["validation"]) / NEURAL_PASSES)
    fits = request.seeds if predictor.seeded else 1
    return fits * rows * TABLE_COST[predictor.kind]


def _fit_model(result: BenchResult, request: BenchRequest, model: ModelSpec, condition: Condition,
               shortfall: str | None, progress: Callable[[dict[str, float]], None] | None = None,
               phase: Callable[[str, int, int], None] | None = None) -> None:
    """Train (or, for a condition too small, mark undefined) one model on one condition, into `result`."""
    data, seeds, key, tune = result.data, result.seeds, (model.name, condition.name), request.tune
    predictor = get_predictor(model.predictor)
    trials = request.trials()
    if shortfall is not None:
        result.fits[key] = _undefined_fits(condition, data, seeds)
        if tune:
            result.untuned[key] = result.fits[key]
    elif predictor.kind == "neural":
        if predictor.training:  # a fixed recipe: the search has nothing to vary
            trials = [{**trials[0], **{k: v for k, v in predictor.training.items() if k in trials[0]}}]
        per_trial = _train_neural(predictor, model, condition, data, trials, request, progress, phase)
        scores = [float(np.nanmean([f.validation_score for f in fits])) for fits in per_trial]
        best = int(np.nanargmax(scores)) if np.isfinite(scores).any() else 0
        result.fits[key] = per_trial[best]
        if tune:
            result.untuned[key] = per_trial[0]
            result.trials[key] = [{**t, "mean_validation_score": s} for t, s in zip(trials, scores)]
    else:
        result.fits[key] = _fit_table_model(predictor, model, condition, data, seeds, request.jobs, phase)
        if tune:  # trees and floors keep their settings: tuned and untuned are the same fits
            result.untuned[key] = result.fits[key]


def _fit_table_model(predictor: Predictor, model: ModelSpec, condition: Condition, data: BenchData,
                     seeds: list[int], n_jobs: int, phase: Callable[[str, int, int], None] | None = None) -> list[Fit]:
    """Tree and floor models: one fit per seed, or one for all seeds when the predictor ignores its seed."""
    if (data.target.kind == "classification" and not predictor.classifies) or \
            set(predictor.reads) & set(data.target.columns):  # not defined: it would read the target itself
        return _undefined_fits(condition, data, seeds)
    fits: list[Fit] = []
    for seed in seeds if predictor.seeded else seeds[:1]:
        request = FitRequest(seed, n_jobs, condition.splits["train"], condition.splits["validation"], data.target,
                             {**predictor.settings, **model.settings}, phase)
        fitted = predictor.fit(request)
        predictions = {s: np.asarray(fitted.predict(condition.splits[s]), dtype=float) for s in SPLITS}
        fits.append(Fit(predictions, {"seeded": predictor.seeded},
                        validation_score(predictions["validation"], condition.splits["validation"].target,
                                         data.target.loss), getattr(fitted, "rounds", None)))
    return fits if predictor.seeded else fits * len(seeds)


def _undefined_fits(condition: Condition, data: BenchData, seeds: list[int]) -> list[Fit]:
    """NaN predictions for every split and seed: a model not defined for this target, or a condition too small."""
    nan = {s: np.full((len(condition.splits[s]), data.target.outputs), np.nan) for s in SPLITS}
    return [Fit(nan, {}, float("nan")) for _ in seeds]


def _train_neural(predictor: Predictor, model: ModelSpec, condition: Condition, data: BenchData,
                  trials: list[dict[str, Any]], request: BenchRequest,
                  progress: Callable[[dict[str, float]], None] | None = None,
                  phase: Callable[[str, int, int], None] | None = None) -> list[list[Fit]]:
    """Every (trial, seed) of a neural model: per trial, the fits of every seed."""
    seeds, device, overrides = request.seed_list(), request.device, request.settings
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
    rows, passed = sum(len(condition.splits[s]) for s in SPLITS), [0]

    def pass_done(count: int) -> None:
        passed[0] += count
        if phase:
            phase("features", passed[0], rows)

    prepared = {s: prepare(nets[0], condition.splits[s].params, pass_done if hasattr(nets[0], "prepare") else None)
                for s in SPLITS}  # the same for every (trial, seed)
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
