"""The paper's baselines (docs/design.md section 9): MLP and STATNN (two modes of one model family, trained like the NFN)
and gradient-boosted / random-forest regressors on the flattened weights (CPU builds of XGBoost and LightGBM,
scikit-learn's Random Forest)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

import numpy as np
import torch
from torch import nn

from small_transformer_zoo.format.architecture import ArchitectureSpec
from small_transformer_zoo.weights.weight_space import TransformerWeights

from .invariant_stats import entry_statistics, feature_count, invariant_statistics
from .model import COMPONENTS, mlp
from .probe_features import output_feature_count, probe_statistics

TREE_MODELS = ("xgboost", "lightgbm", "random_forest")
FLAT_MODES = ("mlp", "statnn", "statnn_invariant", "statnn_probe")


def component_tensors(weights: TransformerWeights, components: Sequence[str]) -> dict[str, list[torch.Tensor]]:
    """Each component's tensors in state_dict layout, each [batch, ...] (one conversion for all components)."""
    tensors = weights.to_state_dicts()
    spec = weights.spec
    return {c: [tensors[p.name] for p in spec.parameters() if spec.component(p.name) == c] for c in components}


def statistics(tensors: list[torch.Tensor]) -> torch.Tensor:
    """STATNN features: per tensor mean, variance and the 0/25/50/75/100% quantiles -> [batch, 7 * tensors]."""
    return torch.cat([entry_statistics(t.flatten(1), 1) for t in tensors], dim=1)


class FlatPredictor(nn.Module):
    """MLP (each component's flattened weights through its own MLP of width 50), STATNN (statistics of every
    tensor through an MLP of width 256), its invariant variant (`invariant_stats`, same MLP) or that variant with
    the statistics of the network's outputs on fixed probes beside it (`probe_features`: the probes run the whole
    network, whatever `components` say); each ends in a dropout, a linear head and, for accuracy, a sigmoid, like
    Transformer-NFN."""

    def __init__(self, spec: ArchitectureSpec, mode: str = "mlp", components: Sequence[str] = COMPONENTS,
                 hidden: int | None = None, outputs: int = 1, head_dropout: float = 0.0) -> None:
        super().__init__()
        if mode not in FLAT_MODES:
            raise ValueError(f"mode must be one of {list(FLAT_MODES)}, got {mode!r}")
        self.spec, self.mode, self.outputs = spec, mode, outputs
        self.components = tuple(c for c in COMPONENTS if c in components
                                and any(spec.component(p.name) == c for p in spec.parameters()))
        sizes = {c: [p for p in spec.parameters() if spec.component(p.name) == c] for c in self.components}
        if mode == "mlp":
            width = hidden or 50
            self.sizes = [sum(p.numel for p in sizes[c]) for c in self.components]
            self.branches = nn.ModuleList(mlp(size, width) for size in self.sizes)
            body_width = width * len(self.components)
        else:
            width = hidden or 256
            features = (7 * sum(len(sizes[c]) for c in self.components) if mode == "statnn"
                        else feature_count(spec, self.components))
            if mode == "statnn_probe":
                features += output_feature_count(spec)
            self.body = nn.Sequential(nn.LayerNorm(features), mlp(features, width))
            body_width = width
        self.head = nn.Sequential(nn.Dropout(head_dropout), nn.Linear(body_width, outputs))

    @torch.no_grad()
    def prepare(self, params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Packed weights -> the model's input: each component's weights side by side (MLP) or the statistics."""
        weights = TransformerWeights.from_params(params, self.spec)
        if self.mode == "statnn_invariant":
            return (invariant_statistics(weights, self.components),)
        if self.mode == "statnn_probe":
            return (torch.cat([invariant_statistics(weights, self.components), probe_statistics(weights)], dim=1),)
        by_component = component_tensors(weights, self.components)
        if self.mode == "statnn":
            return (statistics([t for c in self.components for t in by_component[c]]),)
        return (torch.cat([t.flatten(1) for c in self.components for t in by_component[c]], dim=1),)

    def forward_prepared(self, features: torch.Tensor) -> torch.Tensor:
        if self.mode == "mlp":
            hidden = torch.cat([branch(part) for branch, part in zip(self.branches, features.split(self.sizes, 1))],
                               dim=1)
        else:
            hidden = self.body(features)
        logits = self.head(hidden)
        return logits.squeeze(-1) if self.outputs == 1 else logits

    def forward_logits(self, weights: TransformerWeights) -> torch.Tensor:
        return self.forward_prepared(*self.prepare(weights.to_params()))

    def forward(self, weights: TransformerWeights) -> torch.Tensor:
        return torch.sigmoid(self.forward_logits(weights))


SKETCH_ROWS = 8192


def sketch_rows(rows: int, seed: int, limit: int = SKETCH_ROWS) -> np.ndarray:
    """The rows, drawn by `seed` and sorted, on which XGBoost finds its bin boundaries: all of them up to `limit`."""
    if rows <= limit:
        return np.arange(rows)
    return np.sort(np.random.default_rng(seed).choice(rows, limit, replace=False))


@cache
def sampled_sketch(estimator: type, limit: int = SKETCH_ROWS) -> type:
    """`estimator` (an XGBoost scikit-learn class) with its bin boundaries found on at most `limit` training rows
    (`sketch_rows`, drawn by its `random_state`), then every row binned on them. XGBoost's own sketch of all the
    rows holds about 30 bytes a weight while it runs: 6.3 GiB for 11,000 checkpoints of 18,506 weights, more than
    the data. Splits of up to `limit` rows are binned exactly as by `estimator` itself. One class per
    (estimator, limit)."""
    if limit < 1:
        raise ValueError(f"the sketch needs at least 1 row, got limit={limit}")

    class SampledSketch(estimator):
        def _create_dmatrix(self, ref: Any, **kwargs: Any) -> Any:
            from xgboost import QuantileDMatrix

            data = kwargs.get("data")
            if ref is None and isinstance(data, np.ndarray) and len(data) > limit:
                rows = sketch_rows(len(data), self.random_state or 0, limit)
                ref = QuantileDMatrix(data[rows], max_bin=self.max_bin, nthread=self.n_jobs)
            return super()._create_dmatrix(ref=ref, **kwargs)

    SampledSketch.__name__ = SampledSketch.__qualname__ = f"SampledSketch{estimator.__name__}"
    return SampledSketch


def tree_model(name: str, seed: int, n_estimators: int = 300, n_jobs: int = 1, classification: bool = False) -> Any:
    """The paper's tree settings: max depth 10, min child weight 50, at most 256 leaves; CPU builds on `n_jobs`
    threads; a classifier of the same settings for a class target."""
    if name == "xgboost":
        from xgboost import XGBClassifier, XGBRegressor

        # Leaf by leaf, with a histogram cache of 4 nodes: level by level, XGBoost keeps a 76 MB histogram per node
        # for 18,506 features and needed 20 GB on a 2,839-checkpoint training split. Same trees here (the leaf
        # limit is never reached with min_child_weight 50), bounded memory: on 460 `mini` checkpoints a fit peaked
        # at 1,850 MiB with 32 cached nodes and 1,075 MiB with 4, same predictions, same time within noise.
        kind = sampled_sketch(XGBClassifier if classification else XGBRegressor)
        # min_child_weight bounds a leaf's summed hessian: 1 per sample in regression, p(1 - p) <= 1/4 for a class,
        # so 50 / 4 keeps leaves of at least about 50 samples either way.
        return kind(n_estimators=n_estimators, max_depth=10, min_child_weight=50 / 4 if classification else 50,
                    max_leaves=256,
                    learning_rate=0.05, tree_method="hist", grow_policy="lossguide", max_cached_hist_node=4,
                    random_state=seed, n_jobs=n_jobs, early_stopping_rounds=30)
    if name == "lightgbm":
        from lightgbm import LGBMClassifier, LGBMRegressor

        # The histogram cache capped at 256 MB: uncapped, it keeps one histogram per leaf over 18,506 features and
        # passed 9 GB on a 2,839-checkpoint training split; at 1 GB a fit on 1,400 checkpoints peaked at 1.6 GB,
        # at 256 MB at 0.8 GB in the same time. Evicted histograms are recomputed: same trees.
        kind = LGBMClassifier if classification else LGBMRegressor
        leaves = {"min_child_samples": 50, "min_child_weight": 1e-3} if classification else {"min_child_weight": 50}
        return kind(n_estimators=n_estimators, max_depth=10, num_leaves=256, learning_rate=0.05, random_state=seed,
                    n_jobs=n_jobs, verbose=-1, histogram_pool_size=256, **leaves)
    if name == "random_forest":
        from sklearn.ensemble import RandomForestClassifier, RandomForestRegressor

        kind = RandomForestClassifier if classification else RandomForestRegressor
        return kind(n_estimators=100, max_depth=10, min_samples_leaf=50, max_leaf_nodes=256, random_state=seed,
                    n_jobs=n_jobs)
    raise ValueError(f"unknown tree model {name!r}; choose from {TREE_MODELS}")


class FittedTable:
    """A fitted scikit-learn-style model on a fixed table of features per checkpoint: `predict(split)` gives the
    target's values, or its class probabilities."""

    def __init__(self, model: Any, features: Any, classes: int = 0) -> None:
        self.model, self.features, self.classes = model, features, classes

    @property
    def rounds(self) -> int | None:
        """The boosting rounds early stopping kept (XGBoost, LightGBM); None for a model without rounds."""
        kept = getattr(self.model, "best_iteration", None)  # XGBoost, from 0
        if kept is not None:
            return int(kept) + 1
        kept = getattr(self.model, "best_iteration_", None)  # LightGBM, from 1
        return int(kept) if kept else None

    def predict(self, split: Any) -> np.ndarray:
        x = self.features(split)
        if not self.classes:
            return self.model.predict(x)
        probabilities = np.zeros((len(x), self.classes))  # classes absent from the training split: probability 0
        probabilities[:, np.asarray(self.model.classes_, dtype=int)] = self.model.predict_proba(x)
        return probabilities


def flat_weights(split: Any) -> np.ndarray:
    return split.params.numpy()


FOREST_STEP = 10  # trees a forest grows between two reports of its progress


def fit_tree(model: Any, name: str, train: Any, validation: Any, features: Any = flat_weights,
             classes: int = 0, progress: Callable[[str, int, int], None] | None = None) -> FittedTable:
    """Fit `tree_model(name, ...)` on `features` of the splits (default: the flattened weights), the number of
    boosting rounds chosen on validation (early stopping); the forest has no rounds. `progress(phase, done,
    total)` follows the boosting rounds, or the forest's trees (grown `FOREST_STEP` at a time with `warm_start`,
    which grows the same forest as one fit)."""
    x, y = features(train), train.target
    report = progress or (lambda *_: None)
    rounds = int(model.get_params()["n_estimators"])
    if name == "xgboost":
        from xgboost.callback import TrainingCallback

        class Rounds(TrainingCallback):
            def after_iteration(self, _model: Any, epoch: int, _log: Any) -> bool:
                report("boosting rounds", epoch + 1, rounds)
                return False

        model.set_params(callbacks=[Rounds()])
        model.fit(x, y, eval_set=[(features(validation), validation.target)], verbose=False)
        model.set_params(callbacks=None)
    elif name == "lightgbm":
        from lightgbm import early_stopping

        model.fit(x, y, eval_X=(features(validation),), eval_y=(validation.target,),
                  callbacks=[early_stopping(30, verbose=False),
                             lambda env: report("boosting rounds", env.iteration + 1, env.end_iteration)])
    else:
        for grown in range(min(FOREST_STEP, rounds), rounds + FOREST_STEP, FOREST_STEP):
            model.set_params(n_estimators=min(grown, rounds), warm_start=True)
            model.fit(x, y)
            report("trees", min(grown, rounds), rounds)
        model.set_params(warm_start=False)
    return FittedTable(model, features, classes)
