"""Scoring a benchmark's predictions with their uncertainty, and the tables that show it (docs/design.md section 10).

Every figure is the mean over seeds of a metric on the test split, with a 95% interval from a bootstrap over test
runs: each resample draws the split's runs with replacement and takes all checkpoints of each drawn run, and the
metric is averaged over seeds on every resample. Every model is scored on the same resamples, so the difference of
two models has a paired interval; models whose interval of the difference with the best model holds 0 are tied
with it. The spread over seeds is shown beside each interval: alone it understates the noise, since which runs
land in the test split matters more.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .benchmark import BenchResult
from .resume import Fit
from ..models.metrics import (
    BOOTSTRAP_RESAMPLES,
    BOOTSTRAP_SEED,
    MIN_RUNS,
    RunResamples,
    kendall_tau,
    paired_difference,
    percentile_interval,
    r_squared,
    too_few_runs,
)
from ..models.predictors import get_predictor
from ..models.train import validation_score


@dataclass
class Cell:
    """One metric of one model: seed-mean estimate, 95% interval over runs, spread over seeds, what it rests on."""

    estimate: float
    low: float
    high: float
    seed_sd: float
    runs: int
    checkpoints: int
    values: np.ndarray = field(repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {"estimate": self.estimate, "low": self.low, "high": self.high, "seed_sd": self.seed_sd,
                "runs": self.runs, "checkpoints": self.checkpoints, "too_few_runs": too_few_runs(self.runs)}


@dataclass
class Report:
    columns: list[str]
    main: str
    cells: dict[str, dict[str, Cell]]                   # model -> column -> cell
    fitted: dict[str, dict[str, float]]                 # model -> train / validation main metric (seed-mean)
    versus_best: dict[str, dict[str, Any]]              # model -> paired difference with the best model
    pairwise: dict[str, dict[str, dict[str, Any]]]      # model a -> model b -> difference a - b
    resamples: int
    bootstrap_seed: int
    tuned: bool
    constant: dict[str, list[str]] = field(default_factory=dict)  # tau column -> models whose predictions are constant

    @property
    def best(self) -> str:
        return max(self.cells, key=lambda m: _rank_value(self.cells[m][self.main].estimate))

    def tied(self) -> list[str]:
        return [m for m in self.cells if self.versus_best[m]["tied"]]


def _rank_value(value: float) -> float:
    return value if math.isfinite(value) else -math.inf


def metric_columns(result: BenchResult, thresholds: Sequence[float]) -> list[str]:
    if result.data.target.kind == "classification":
        return ["accuracy", "macro_f1"]
    return ["tau"] + [f"tau@{t:g}" for t in thresholds] + ["r2", "l1"]


def _class_metric(name: str, predicted: np.ndarray, true: np.ndarray, classes: int) -> float:
    if not len(true) or not np.isfinite(predicted).all():
        return math.nan
    chosen = predicted.argmax(-1)
    if name == "accuracy":
        return float(np.mean(chosen == true))
    from sklearn.metrics import f1_score

    return float(f1_score(true, chosen, labels=list(range(classes)), average="macro", zero_division=0))


def metric_value(column: str, predicted: np.ndarray, true: np.ndarray, accuracy: np.ndarray, index: np.ndarray,
                 classes: int = 0) -> float:
    """One column's metric on the checkpoints `index` of a test split (those whose test `accuracy` reaches the
    threshold, for `tau@t`)."""
    if column in ("accuracy", "macro_f1"):
        return _class_metric(column, predicted[index], true[index], classes)
    if column.startswith("tau@"):
        index = index[accuracy[index] >= float(column[4:])]
        column = "tau"
    if column == "tau":
        return kendall_tau(predicted[index], true[index])
    if column == "r2":
        return r_squared(predicted[index], true[index]) if len(index) else math.nan
    return float(np.mean(np.abs(predicted[index] - true[index]))) if len(index) else math.nan


def _where(result: BenchResult, column: str) -> tuple[str, str]:
    """(condition, metric) a column is read from: in the paper protocol tau above a threshold is the tau of the
    model trained on the zoo filtered at that threshold."""
    if result.data.protocol == "paper" and column.startswith("tau@"):
        return f">={column[4:]}", "tau"
    return "all", column


def _cell(result: BenchResult, fits: list[Fit], condition: str, column: str, draws: RunResamples) -> Cell:
    split = next(c for c in result.conditions if c.name == condition).splits["test"]
    classes = len(result.data.target.classes)
    everything = np.arange(len(split))
    def value(fit: Fit, index: np.ndarray) -> float:
        return metric_value(column, fit.predictions["test"], split.target, split.accuracy, index, classes)

    per_seed = [value(f, everything) for f in fits]
    values = np.asarray([_mean([value(f, index) for f in fits]) for index in draws.indices])
    low, high = percentile_interval(values)
    kept = everything[_scored(split, column)]
    finite = [v for v in per_seed if math.isfinite(v)]
    return Cell(float(np.mean(finite)) if finite else math.nan, low, high,
                float(np.std(finite)) if len(finite) > 1 else 0.0, len(set(split.runs[kept].tolist())), len(kept),
                values)


def _scored(split: Any, column: str) -> np.ndarray:
    """Which test checkpoints a column is computed on: those at or above its threshold for `tau@T`, else all."""
    return split.accuracy >= float(column[4:]) if column.startswith("tau@") else np.ones(len(split), dtype=bool)


def _constant_on_test(result: BenchResult, fits: list[Fit], condition: str, column: str) -> bool:
    """Every seed predicts one value for all test checkpoints behind a tau column, so tau has none (e.g. trees
    whose leaves need 50 checkpoints, trained on fewer than 100)."""
    split = next(c for c in result.conditions if c.name == condition).splits["test"]
    kept = _scored(split, column)
    values = [np.asarray(f.predictions["test"], dtype=float)[kept] for f in fits]
    return bool(kept.sum() > 1) and all(np.isfinite(v).all() and np.ptp(v) == 0 for v in values)


def _mean(values: Sequence[float]) -> float:
    """The mean of the defined values (NaN when none is)."""
    finite = [v for v in values if math.isfinite(v)]
    return float(np.mean(finite)) if finite else math.nan


def _undefined(cell: Cell) -> Cell:
    """A metric in the target's unit, for a model that only ranks: not defined."""
    return Cell(math.nan, math.nan, math.nan, math.nan, cell.runs, cell.checkpoints, np.full_like(cell.values, math.nan))


def score(result: BenchResult, thresholds: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES,
          bootstrap_seed: int = BOOTSTRAP_SEED, tuned: bool = True) -> Report:
    """Every model's cells, its train and validation scores, and its paired differences (module docstring);
    `tuned=False` scores the default trial of a tuned benchmark."""
    fits_of = result.fits if tuned else (result.untuned or result.fits)
    columns = metric_columns(result, thresholds)
    main = columns[0]
    draws = {c.name: RunResamples.of(c.splits["test"].runs.tolist(), resamples, bootstrap_seed)
             for c in result.conditions}
    cells: dict[str, dict[str, Cell]] = {}
    fitted: dict[str, dict[str, float]] = {}
    constant: dict[str, list[str]] = {}
    for model in result.models:
        cells[model] = {}
        for column in columns:
            condition, metric = _where(result, column)
            cells[model][column] = _cell(result, fits_of[(model, condition)], condition, metric, draws[condition])
            if column.startswith("tau") and _constant_on_test(result, fits_of[(model, condition)], condition, column):
                constant.setdefault(column, []).append(model)
            if column in ("r2", "l1") and get_predictor(result.specs[model]).ranks_only:
                cells[model][column] = _undefined(cells[model][column])
        fits = fits_of[(model, "all")]
        everything = next(c for c in result.conditions if c.name == "all").splits
        fitted[model] = {s: _mean([validation_score(f.predictions[s], everything[s].target, result.data.target.loss)
                                   for f in fits]) for s in ("train", "validation")}
    pairwise = {a: {b: paired_difference(cells[a][main].values, cells[b][main].values, cells[a][main].estimate,
                                         cells[b][main].estimate) for b in cells if b != a} for a in cells}
    report = Report(columns, main, cells, fitted, {}, pairwise, resamples, bootstrap_seed, tuned, constant)
    best = report.best
    report.versus_best = {m: ({"estimate": 0.0, "low": 0.0, "high": 0.0, "tied": True, "decided": True} if m == best
                              else pairwise[m][best]) for m in cells}
    return report


def _number(value: float, digits: int = 3) -> str:
    return "-" if not math.isfinite(value) else f"{value:.{digits}f}"


def _interval(cell: Cell) -> str:
    if too_few_runs(cell.runs):
        return f"too few runs ({cell.runs})"
    if not math.isfinite(cell.estimate):
        return "-"
    if not (math.isfinite(cell.low) and math.isfinite(cell.high)):
        return f"{cell.estimate:.3f} [-]"
    return f"{cell.estimate:.3f} [{cell.low:.3f}, {cell.high:.3f}]"


def column_title(column: str) -> str:
    return {"tau": "tau (all)", "r2": "R^2", "l1": "L1", "accuracy": "accuracy", "macro_f1": "macro-F1"}.get(
        column, f"tau (acc >= {column[4:]})")


SECOND_TABLE = ("r2", "l1")  # columns of the second table: how well the values fit, beside the ranking


def render_markdown(report: Report, result: BenchResult, config: str) -> str:
    """Two tables. The first ranks: each tau (or accuracy) cell the seed-mean with its 95% interval over test runs,
    only the columns resting on enough test runs (the others named in one line), and the difference with the best
    model (paired interval; `tied` when it holds 0, n/a without an interval). The second shows the fit: R^2 and L1
    where the target has a unit, train and validation scores (overfitting shows as a gap) and the spread over
    seeds. The notes speak only of what the tables show."""
    data, main = result.data, report.main
    seeds = len(result.seeds)
    first = next(iter(report.cells.values()))
    ranking = [c for c in report.columns if c not in SECOND_TABLE]
    shown = [c for c in ranking if c == main or not too_few_runs(first[c].runs)]
    hidden = [c for c in ranking if c not in shown]
    counts = "; ".join(f"{column_title(c)}: {first[c].runs} runs, {first[c].checkpoints:,} checkpoints"
                       for c in shown if c != "macro_f1")
    protocol = data.protocol + (f", epoch {data.epoch}" if data.epoch is not None else "")
    estimate = "mean over seeds" if seeds > 1 else "the one seed's figure"
    tied = [m for m in report.tied() if m != report.best]
    lines = [f"Zoo config `{config}`: target {data.target.name}, protocol {protocol}, preprocessing "
             f"{data.preprocess}, {seeds} seed{'s' if seeds > 1 else ''}, "
             f"{'tuned' if report.tuned and result.untuned else 'untuned'}"
             + f", splits {data.split_rule.describe()}"
             + (f", split salt {data.split_salt!r}" if data.split_salt else "")
             + (f", every checkpoint moved by a random element of the {data.randomize} symmetry group"
                if data.randomize else "") + ".",
             f"Each cell: {estimate} [95% interval from {report.resamples} bootstrap resamples of the test runs, "
             f"seed {report.bootstrap_seed}]. Test split: {counts}.",
             f"Best: {report.best}; tied with it (paired interval of the difference holds 0): "
             f"{', '.join(tied) if tied else 'none'}."]
    if hidden:
        lines.append("Not shown, resting on fewer than " + f"{MIN_RUNS} test runs: " + ", ".join(
            f"{column_title(c)} ({first[c].runs})" for c in hidden) + " (in the results JSON).")
    if too_few_runs(first[main].runs):
        lines.append(f"{column_title(main)}: fewer than {MIN_RUNS} test runs, shown as \"too few runs (n)\".")
    if any(not v["decided"] for v in report.versus_best.values() if math.isfinite(v["estimate"])):
        lines.append("n/a: the difference with the best has no interval (the metric is undefined on most "
                     "resamples), so the two are neither tied nor apart.")
    if any(_interval(report.cells[m][c]).endswith("[-]") for m in report.cells for c in shown):
        lines.append("[-]: no interval, because the metric is undefined on most resamples (e.g. constant "
                     "predictions or one checkpoint).")
    lines += nearest_note(report, result)
    lines += [f"Not trained at {name} (too few checkpoints left by the filter: {why})."
              for name, why in result.skipped.items() if any(_where(result, c)[0] == name for c in shown)]
    lines += [f"No {column_title(column)} for {', '.join(models)}: constant predictions on its test checkpoints "
              "(the input of a floor that does not vary there, such as the epoch when every checkpoint is from one "
              "epoch, or a tree whose leaves need 50 checkpoints, which cannot split fewer than 100)."
              for column, models in report.constant.items() if column in shown]
    header = ["model", *(column_title(c) for c in shown), f"vs best ({column_title(main)})"]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for model, row in report.cells.items():
        lines.append(f"| {model} | " + " | ".join([*(_interval(row[c]) for c in shown), _versus(report, model)])
                     + " |")
    fitted_name = "accuracy" if data.target.kind == "classification" else "tau"
    fit_columns = [c for c in report.columns if c in SECOND_TABLE]
    header = ["model", *(column_title(c) for c in fit_columns), f"train {fitted_name}", f"validation {fitted_name}",
              *(["seed sd"] if seeds > 1 else [])]
    lines += ["", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for model, row in report.cells.items():
        cells = [*(_interval(row[c]) for c in fit_columns), _number(report.fitted[model]["train"]),
                 _number(report.fitted[model]["validation"]), *([_number(row[main].seed_sd)] if seeds > 1 else [])]
        lines.append(f"| {model} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _versus(report: Report, model: str) -> str:
    """A model's difference with the best in the main metric, as the first table shows it."""
    versus = report.versus_best[model]
    if model == report.best:
        return "best"
    if not math.isfinite(versus["estimate"]):
        return "-"
    if not versus["decided"]:
        return f"{versus['estimate']:+.3f} n/a"
    return (f"{versus['estimate']:+.3f} [{_number(versus['low'])}, {_number(versus['high'])}]"
            + (" tied" if versus["tied"] else ""))


def nearest_note(report: Report, result: BenchResult) -> list[str]:
    """What the `nearest_run` floor could read, in words: how many test checkpoints have a training checkpoint
    within `CLONE_DISTANCE` (the clone census's distance between weight directions), or that none does."""
    if "nearest_run" not in report.cells:
        return []
    from small_transformer_zoo.store.census import CLONE_DISTANCE, UNRELATED, nearest_distances

    splits = next(c for c in result.conditions if c.name == "all").splits
    distances = nearest_distances(splits["test"].params, splits["train"].params)
    near = int(np.sum(distances <= CLONE_DISTANCE))
    median = float(np.median(distances))
    if near:
        return [f"nearest_run: {near} of {len(distances)} test checkpoints have a training checkpoint within "
                f"{CLONE_DISTANCE:g} (distance between weight directions; median {median:.2f})."]
    kind = "as far as unrelated networks are" if median > UNRELATED else "closer than unrelated networks"
    return [f"nearest_run: no test checkpoint has a training checkpoint within {CLONE_DISTANCE:g} (median distance to "
            f"the nearest {median:.2f}, {kind}, about 1.41): it has no clone to read, only the nearest of unrelated "
            f"networks."]


def report_json(report: Report, result: BenchResult) -> dict[str, Any]:
    """Everything the table shows, plus the chosen trials, the tuning record and every seed's figures."""
    out: dict[str, Any] = {"data": result.data.describe(), "seeds": result.seeds, "main_metric": report.main,
                           "bootstrap": {"resamples": report.resamples, "seed": report.bootstrap_seed,
                                         "unit": "test run", "confidence": 0.95},
                           "tuned": report.tuned and bool(result.untuned), "best": report.best,
                           "tied_with_best": report.tied(), "constant_predictions": report.constant,
                           "models": {}}
    fits_of = result.fits if report.tuned else (result.untuned or result.fits)
    for model, row in report.cells.items():
        fits = fits_of[(model, "all")]
        out["models"][model] = {
            "columns": {c: cell.to_dict() for c, cell in row.items()},
            "train": report.fitted[model]["train"], "validation": report.fitted[model]["validation"],
            "versus_best": report.versus_best[model], "differences": report.pairwise[model],
            "chosen": [f.trial for f in fits], "best_epochs": [f.best_epoch for f in fits],
            "tuning": {cond: result.trials[(model, cond)] for (m, cond) in result.trials if m == model},
        }
    return out


def plot_predictions(result: BenchResult, report: Report, path: str | os.PathLike[str], config: str) -> Path:
    """Predicted against true values of the test split, one panel per model, first seed (the paper's Figure 2).
    Models that only rank (floors such as the L2 norm or the epoch, whose outputs are not in the target's unit) are
    left out: against the y = x line they would mean nothing; with no other model there is nothing to plot."""
    from small_transformer_zoo.plots import new_figure, save_figure

    test = next(c for c in result.conditions if c.name == "all").splits["test"]
    names = [m for m in report.cells if not get_predictor(result.specs[m]).ranks_only]
    if not names:
        raise ValueError("every model only ranks: no predicted values to plot against the true ones")
    columns = min(3, len(names))
    rows = math.ceil(len(names) / columns)
    figure, axes = new_figure(rows, columns, (3.6 * columns, 3.4 * rows))
    low, high = float(np.min(test.target)), float(np.max(test.target))
    for axis, name in zip(axes.flat, names):
        axis.scatter(test.target, result.fits[(name, "all")][0].predictions["test"], s=8, alpha=0.6)
        axis.plot([low, high], [low, high], color="grey", linewidth=1)
        axis.set_title(f"{name}\n{report.main} {_interval(report.cells[name][report.main])}", fontsize=8)
        axis.set_xlabel(f"true {result.data.target.name}")
        axis.set_ylabel("predicted")
    for axis in list(axes.flat)[len(names):]:
        axis.axis("off")
    return save_figure(figure, f"{config}: predicted against true {result.data.target.name} (first seed)", path)
