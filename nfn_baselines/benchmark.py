"""The benchmark protocol (docs/design.md section 10): every model on the same splits, seeds, model selection on validation
only, Kendall's tau on the test split overall and above accuracy thresholds, R^2 and L1, mean and standard
deviation over seeds; the paper's Table 1/2 as Markdown and JSON, and predicted-against-true plots."""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from small_transformer_zoo import Zoo, as_zoo
from small_transformer_zoo.format.architecture import ArchitectureSpec
from small_transformer_zoo.weights.canonical import canonicalize_params
from small_transformer_zoo.store.files import atomic_write_json
from small_transformer_zoo.plots import new_figure, save_figure
from small_transformer_zoo.weights.standardize import WeightStats
from small_transformer_zoo.weights.weight_space import TransformerWeights

from .metrics import DEFAULT_THRESHOLDS, defined, scores
from .model import COMPONENTS
from .predictors import default_predictors, get_predictor
from .train import TrainConfig, predict, train_predictor

COMPONENT_ABLATION = (("encoder",), ("embedding",), ("classifier",), ("encoder", "embedding"),
                      ("encoder", "classifier"), ("embedding", "classifier"), COMPONENTS)
WIDTH_DEPTH_ABLATION = ((5, 1), (10, 1), (20, 1), (10, 2))


@dataclass
class ModelSpec:
    """One row of the table: a registered predictor (`nfn_baselines.predictors`) and the settings it overrides."""

    name: str
    predictor: str
    settings: dict[str, Any] = field(default_factory=dict)


PREPROCESSING = ("none", "standardize", "canonical", "both")


@dataclass
class BenchData:
    spec: ArchitectureSpec
    splits: dict[str, tuple[torch.Tensor, torch.Tensor]]
    test_ids: list[str]
    preprocess: str = "none"
    stats: WeightStats | None = None


@dataclass
class BenchResult:
    rows: dict[str, list[dict[str, float]]] = field(default_factory=dict)
    predictions: dict[str, np.ndarray] = field(default_factory=dict)
    true: np.ndarray | None = None


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


def load_bench_data(zoo: Zoo | str | os.PathLike[str], config: str | None = None,
                    preprocess: str = "none") -> BenchData:
    """Packed weights and test accuracy per split; diverged runs are left out (their accuracy means nothing).

    `preprocess`: "canonical" puts every checkpoint in its canonical form, "standardize" applies statistics of the
    training split (pooled as `small_transformer_zoo.weights.standardize` says), "both" does the first, then the second;
    every model, the NFN and the baselines alike, sees the same preprocessed weights."""
    if preprocess not in PREPROCESSING:
        raise ValueError(f"unknown preprocessing {preprocess!r}; choose from {list(PREPROCESSING)}")
    zoo = as_zoo(zoo, config)
    splits, test_ids = {}, []
    for split in ("train", "validation", "test"):
        weights = zoo.split_weights(split)
        keep = zoo.select(split)
        if len(keep) < 2:
            raise ValueError(f"{zoo.dir}: split {split!r} has {len(keep)} usable checkpoints; the benchmark needs "
                             f"at least 2 in every split")
        splits[split] = (weights.rows(keep), weights.labels()[torch.from_numpy(keep)])
        if split == "test":
            test_ids = [weights.metadata.column("checkpoint_id")[int(i)].as_py() for i in keep]
    stats = None
    if preprocess in ("canonical", "both"):
        splits = {k: (canonicalize_params(p, zoo.spec), y) for k, (p, y) in splits.items()}
    if preprocess in ("standardize", "both"):
        stats = WeightStats.of(TransformerWeights.from_params(splits["train"][0], zoo.spec))
        splits = {k: (stats.apply(TransformerWeights.from_params(p, zoo.spec)).to_params().to(p.dtype), y)
                  for k, (p, y) in splits.items()}
    return BenchData(zoo.spec, splits, test_ids, preprocess, stats)


def predict_test(model: ModelSpec, data: BenchData, seed: int, epochs: int, device: str = "cpu",
                 n_jobs: int = 1) -> np.ndarray:
    """Train one model with one seed (selection on validation) and predict the test split. Neural models train on
    `device` (torch's global random state is seeded for them and put back after); tree models on the CPU with
    `n_jobs` threads (the xgboost-cpu and lightgbm wheels are CPU builds)."""
    predictor = get_predictor(model.predictor)
    settings = {**predictor.settings, **model.settings}
    if predictor.kind == "tree":
        as_numpy = {k: (v[0].numpy(), v[1].numpy()) for k, v in data.splits.items()}
        fitted = predictor.fit(seed, n_jobs, as_numpy["train"], as_numpy["validation"], settings)
        return np.clip(fitted.predict(as_numpy["test"][0]), 0.0, 1.0)
    with torch.random.fork_rng(devices=[]):  # the model's initialisation draws from the global generator
        torch.manual_seed(seed)
        net = predictor.build(data.spec, settings)
    config = TrainConfig(epochs=epochs, warmup_epochs=max(1, epochs // 10), seed=seed, device=device)
    result = train_predictor(net, data.spec, data.splits["train"], data.splits["validation"], config)
    return predict(result.model, data.splits["test"][0], data.spec)


def run_benchmark(data: BenchData, models: list[ModelSpec], seeds: Sequence[int], epochs: int,
                  thresholds: Sequence[float] = DEFAULT_THRESHOLDS,
                  on_done: Callable[[str, int, dict[str, float]], None] | None = None,
                  device: str = "cpu", n_jobs: int = 1) -> BenchResult:
    result = BenchResult(true=data.splits["test"][1].numpy())
    for model in models:
        for seed in seeds:
            predicted = predict_test(model, data, seed, epochs, device, n_jobs)
            row = scores(predicted, result.true, tuple(thresholds))
            result.rows.setdefault(model.name, []).append(row)
            if seed == seeds[0]:
                result.predictions[model.name] = predicted
            if on_done:
                on_done(model.name, seed, row)
    return result


def summarize(result: BenchResult) -> dict[str, dict[str, dict[str, float]]]:
    """Mean and standard deviation over seeds of every metric, per model."""
    out = {}
    for name, rows in result.rows.items():
        out[name] = {}
        for key in rows[0]:
            values = np.asarray([r[key] for r in rows], dtype=float)
            finite = values[np.isfinite(values)]
            out[name][key] = {"mean": float(finite.mean()) if finite.size else math.nan,
                              "std": float(finite.std()) if finite.size else math.nan}
    return out


def render_markdown(summary: dict[str, dict[str, dict[str, float]]], thresholds: Sequence[float], seeds: int,
                    config: str) -> str:
    """The paper's Table 1/2 form: Kendall's tau by accuracy threshold, then R^2 and L1, mean +- std."""
    def cell(stats: dict[str, float]) -> str:
        return "-" if math.isnan(stats["mean"]) else f"{stats['mean']:.3f} ± {stats['std']:.3f}"

    first = next(iter(summary.values()))
    counts = " / ".join(f"{int(first[f'n@{t:g}']['mean'])}" for t in thresholds)
    header = ["model", "tau (all)"] + [f"tau (acc >= {t:g})" for t in thresholds] + ["R^2", "L1"]
    lines = [f"Zoo config `{config}`, {seeds} seed(s); test checkpoints: {int(first['n']['mean'])} in all, "
             f"{counts} above the thresholds.", "",
             "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, stats in summary.items():
        cells = [cell(stats["tau"])] + [cell(stats[f"tau@{t:g}"]) for t in thresholds] + \
            [cell(stats["r2"]), cell(stats["l1"])]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_predictions(result: BenchResult, path: str | os.PathLike[str], config: str) -> Path:
    """Predicted against true test accuracy, one panel per model (the paper's Figure 2)."""
    names = list(result.predictions)
    columns = min(3, len(names))
    rows = math.ceil(len(names) / columns)
    figure, axes = new_figure(rows, columns, (3.6 * columns, 3.4 * rows))
    low, high = float(np.min(result.true)), float(np.max(result.true))
    for axis, name in zip(axes.flat, names):
        axis.scatter(result.true, result.predictions[name], s=8, alpha=0.6)
        axis.plot([low, high], [low, high], color="grey", linewidth=1)
        tau = result.rows[name][0]["tau"]
        axis.set_title(f"{name}\ntau {tau:.3f}", fontsize=9)
        axis.set_xlabel("true test accuracy")
        axis.set_ylabel("predicted")
    for axis in list(axes.flat)[len(names):]:
        axis.axis("off")
    return save_figure(figure, f"{config}: predicted against true accuracy (first seed)", path)


def write_results(out: Path, config: str, summary: dict, result: BenchResult, markdown: str,
                  meta: dict[str, Any]) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out / f"{config}-bench.json", out / f"{config}-bench.md"
    atomic_write_json(json_path, defined({**meta, "summary": summary, "per_seed": result.rows}))
    md_path.write_text(markdown)
    return {"json": json_path, "markdown": md_path}
