"""`stz bench` as a library call: load the data, train and score every model, repeat on other run splits if asked,
and write the tables, the JSON, the plots and each predicting model's first-seed submission (the ranking floors,
whose values are not in the target's unit, have none)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from small_transformer_zoo import Zoo
from small_transformer_zoo.store.files import atomic_write_bytes, atomic_write_json

from .data import read_bench_data
from .resume import FitStore
from .benchmark import BenchResult, run_benchmark
from .request import BenchRequest
from ..models.metrics import defined
from ..models.predictors import get_predictor
from .report import Report, plot_predictions, render_markdown, report_json, score
from .submission import write_submission


@dataclass
class BenchOutcome:
    result: BenchResult
    report: Report
    markdown: str
    paths: dict[str, Path]
    seconds: float           # this process's wall time
    training_seconds: float  # the time every fit took to train, fits resumed from a stopped run included
    resumed: int             # (model, condition)s read back from a stopped run


def fit_seconds(results: list[BenchResult]) -> dict[str, dict[str, float]]:
    """Per model and condition, the seconds its fits took to train (every seed and trial, summed over the run
    splits of `--resplit`): where a benchmark's time goes."""
    out: dict[str, dict[str, float]] = {}
    for result in results:
        for (model, condition), seconds in result.seconds.items():
            out.setdefault(model, {})
            out[model][condition] = out[model].get(condition, 0.0) + seconds
    return out


def bench_store(zoo: Zoo, request: BenchRequest, out: Path) -> FitStore:
    """Where the finished fits of this run are kept until its results are written (`bench_resume`)."""
    return FitStore.for_run(out, request.stem(zoo.config), zoo, _request_json(request))


def run_bench(zoo: Zoo, request: BenchRequest, out: Path,
              on_done: Callable[[str, str, int], None] | None = None, fresh: bool = False,
              on_epoch: Callable[[str, str], None] | None = None, progress: Any = None) -> BenchOutcome:
    """Run the benchmark on `zoo` and write its results under `out`. A run stopped before it wrote them resumes
    from the fits it had finished, unless `fresh`. `progress`: a `BenchProgress` (`run_benchmark`)."""
    started = time.perf_counter()
    store = bench_store(zoo, request, out)
    if fresh:
        store.clear()
    results: list[BenchResult] = []

    def bench(split_salt: str | None) -> BenchResult:
        results.append(run_benchmark(read_bench_data(zoo, request.data_selection(split_salt)), request, store, on_done,
                                     on_epoch, progress))
        return results[-1]

    result = bench(None)
    report = score(result, request.thresholds, request.resamples, request.bootstrap_seed)
    markdown = render_markdown(report, result, zoo.config)
    document = {"zoo": str(zoo.dir), "config": zoo.config, "request": _request_json(request),
                **report_json(report, result)}
    if request.tune:
        untuned = score(result, request.thresholds, request.resamples, request.bootstrap_seed, tuned=False)
        markdown += "\nThe same models untuned (the default trial of the search):\n\n" + \
            render_markdown(untuned, result, zoo.config)
        document["untuned"] = report_json(untuned, result)
    if request.resplit:
        splits = [report] + [score(bench(f"resplit-{k}"), request.thresholds, request.resamples,
                                   request.bootstrap_seed) for k in range(1, request.resplit + 1)]
        spread = split_spread(splits)
        markdown += "\n" + render_spread(spread, report.main, request.resplit, request.seeds)
        document["resplit"] = {"salts": [None] + [f"resplit-{k}" for k in range(1, request.resplit + 1)],
                               "models": spread}
    seconds = time.perf_counter() - started
    training_seconds = sum(sum(r.seconds.values()) for r in results)
    resumed = sum(r.resumed for r in results)
    document.update(seconds=seconds, training_seconds=training_seconds, resumed_fits=resumed,
                    fit_seconds=fit_seconds(results))
    stem = request.stem(zoo.config)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "markdown": out / f"{stem}.md"}
    atomic_write_json(paths["json"], defined(document))
    atomic_write_bytes(paths["markdown"], markdown.encode())
    if result.data.target.kind == "regression" and any(not get_predictor(s).ranks_only
                                                       for s in result.specs.values()):
        paths["plot"] = plot_predictions(result, report, out / f"{stem}-predicted-vs-true.png", zoo.config)
    column = result.data.target.submission_column
    for model in (m for m in result.models if not get_predictor(result.specs[m]).ranks_only):
        predicted = first_seed_predictions(result, model)
        if result.data.target.kind == "classification":
            predicted = np.asarray(result.data.target.classes, dtype=object)[predicted.astype(int)]
        paths[f"submission:{model}"] = write_submission(out / "submissions" / f"{stem}-{model}.csv",
                                                        result.data.test_ids, predicted, column)
    store.finish()
    return BenchOutcome(result, report, markdown, paths, seconds, training_seconds, resumed)


def _request_json(request: BenchRequest) -> dict[str, Any]:
    data = {k: v for k, v in vars(request).items()}
    data["where"] = {k: sorted(v, key=repr) if isinstance(v, (set, frozenset)) else v
                     for k, v in request.where.items()}
    data["thresholds"] = list(request.thresholds)
    return data


def split_spread(reports: list[Report]) -> dict[str, dict[str, float]]:
    """Per model, the main metric over run splits (the zoo's own first): its mean, its spread over splits, and
    the mean spread over seeds within a split."""
    out = {}
    for model in reports[0].cells:
        estimates = np.asarray([r.cells[model][r.main].estimate for r in reports], dtype=float)
        seed_sds = np.asarray([r.cells[model][r.main].seed_sd for r in reports], dtype=float)
        finite = estimates[np.isfinite(estimates)]
        out[model] = {"zoo_split": float(estimates[0]),
                      "mean_over_splits": float(finite.mean()) if finite.size else math.nan,
                      "sd_over_splits": float(finite.std()) if finite.size > 1 else math.nan,
                      "mean_sd_over_seeds": float(np.mean(seed_sds[np.isfinite(seed_sds)]))
                      if np.isfinite(seed_sds).any() else math.nan, "per_split": estimates.tolist()}
    return out


def render_spread(spread: dict[str, dict[str, float]], main: str, resplits: int, seeds: int) -> str:
    lines = [f"Split noise: {main} on the zoo's own run split and {resplits} others (the same fractions, other "
             f"salts), {seeds} seed(s) each.", "",
             "| model | zoo split | mean over splits | sd over splits | sd over seeds (mean) |", "|---|---|---|---|---|"]
    for model, row in spread.items():
        lines.append(f"| {model} | {row['zoo_split']:.3f} | {row['mean_over_splits']:.3f} | "
                     f"{row['sd_over_splits']:.3f} | {row['mean_sd_over_seeds']:.3f} |")
    return "\n".join(lines) + "\n"


def first_seed_predictions(result: BenchResult, model: str) -> np.ndarray:
    """A model's first-seed predictions of the test split of the zoo's own split (what it submits): the target's
    values, or the predicted class of a class target."""
    predicted = result.fits[(model, "all")][0].predictions["test"]
    return predicted.argmax(-1) if result.data.target.kind == "classification" else predicted
