"""The paper's baselines (docs/design.md section 9): MLP and STATNN (two modes of one model family, trained like the NFN)
and gradient-boosted / random-forest regressors on the flattened weights (CPU builds of XGBoost and LightGBM,
scikit-learn's Random Forest)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from small_transformer_zoo.format.architecture import ArchitectureSpec
from small_transformer_zoo.weights.weight_space import TransformerWeights

from .model import COMPONENTS, mlp

QUANTILES = (0.0, 0.25, 0.5, 0.75, 1.0)
TREE_MODELS = ("xgboost", "lightgbm", "random_forest")


def component_tensors(weights: TransformerWeights, components: Sequence[str]) -> dict[str, list[torch.Tensor]]:
    """Each component's tensors in state_dict layout, each [batch, ...] (one conversion for all components)."""
    tensors = weights.to_state_dicts()
    spec = weights.spec
    return {c: [tensors[p.name] for p in spec.parameters() if spec.component(p.name) == c] for c in components}


def statistics(tensors: list[torch.Tensor]) -> torch.Tensor:
    """STATNN features: per tensor mean, variance and the 0/25/50/75/100% quantiles -> [batch, 7 * tensors]."""
    features = []
    q = None
    for tensor in tensors:
        flat = tensor.flatten(1)
        if q is None or q.dtype != flat.dtype:
            q = torch.tensor(QUANTILES, dtype=flat.dtype)
        features += [flat.mean(1, keepdim=True), flat.var(1, keepdim=True, unbiased=False),
                     torch.quantile(flat, q, dim=1).T]
    return torch.cat(features, dim=1)


class FlatPredictor(nn.Module):
    """MLP (each component's flattened weights through its own MLP of width 50) or STATNN (statistics of every
    tensor through an MLP of width 256); both end in a linear head and a sigmoid, like Transformer-NFN."""

    def __init__(self, spec: ArchitectureSpec, mode: str = "mlp", components: Sequence[str] = COMPONENTS,
                 hidden: int | None = None) -> None:
        super().__init__()
        if mode not in ("mlp", "statnn"):
            raise ValueError(f"mode must be 'mlp' or 'statnn', got {mode!r}")
        self.spec, self.mode = spec, mode
        self.components = tuple(c for c in COMPONENTS if c in components
                                and any(spec.component(p.name) == c for p in spec.parameters()))
        sizes = {c: [p for p in spec.parameters() if spec.component(p.name) == c] for c in self.components}
        if mode == "mlp":
            width = hidden or 50
            self.branches = nn.ModuleDict({c: mlp(sum(p.numel for p in sizes[c]), width) for c in self.components})
            self.head = nn.Linear(width * len(self.components), 1)
        else:
            width = hidden or 256
            features = 7 * sum(len(sizes[c]) for c in self.components)
            self.body = nn.Sequential(nn.LayerNorm(features), mlp(features, width))
            self.head = nn.Linear(width, 1)

    def forward_logits(self, weights: TransformerWeights) -> torch.Tensor:
        by_component = component_tensors(weights, self.components)
        if self.mode == "mlp":
            parts = [branch(torch.cat([t.flatten(1) for t in by_component[c]], dim=1))
                     for c, branch in self.branches.items()]
            return self.head(torch.cat(parts, dim=1)).squeeze(-1)
        tensors = [t for c in self.components for t in by_component[c]]
        return self.head(self.body(statistics(tensors))).squeeze(-1)

    def forward(self, weights: TransformerWeights) -> torch.Tensor:
        return torch.sigmoid(self.forward_logits(weights))


def tree_model(name: str, seed: int, n_estimators: int = 300, n_jobs: int = 1) -> Any:
    """The paper's tree settings: max depth 10, min child weight 50, at most 256 leaves; CPU builds on `n_jobs`
    threads."""
    if name == "xgboost":
        from xgboost import XGBRegressor

        # Leaf by leaf, with a small histogram cache: level by level, XGBoost keeps a 76 MB histogram per node for
        # 18,506 features and needed 20 GB on a 2,839-checkpoint training split. Same trees here (the leaf limit
        # is never reached with min_child_weight 50), bounded memory.
        return XGBRegressor(n_estimators=n_estimators, max_depth=10, min_child_weight=50, max_leaves=256,
                            learning_rate=0.05, tree_method="hist", grow_policy="lossguide",
                            max_cached_hist_node=32, random_state=seed, n_jobs=n_jobs, early_stopping_rounds=30)
    if name == "lightgbm":
        from lightgbm import LGBMRegressor

        # The histogram cache capped at 1 GB: uncapped, it keeps one histogram per leaf over 18,506 features and
        # passed 9 GB on a 2,839-checkpoint training split. Evicted histograms are recomputed: same trees.
        return LGBMRegressor(n_estimators=n_estimators, max_depth=10, min_child_weight=50, num_leaves=256,
                             learning_rate=0.05, random_state=seed, n_jobs=n_jobs, verbose=-1,
                             histogram_pool_size=1024)
    if name == "random_forest":
        from sklearn.ensemble import RandomForestRegressor

        return RandomForestRegressor(n_estimators=100, max_depth=10, min_samples_leaf=50, max_leaf_nodes=256,
                                     random_state=seed, n_jobs=n_jobs)
    raise ValueError(f"unknown tree model {name!r}; choose from {TREE_MODELS}")


def fit_tree(model: Any, name: str, train: tuple[np.ndarray, np.ndarray],
             validation: tuple[np.ndarray, np.ndarray]) -> Any:
    """Fit `tree_model(name, ...)` with the number of boosting rounds chosen on validation (early stopping); the
    forest has no rounds."""
    if name == "xgboost":
        model.fit(*train, eval_set=[validation], verbose=False)
    elif name == "lightgbm":
        from lightgbm import early_stopping

        model.fit(*train, eval_X=(validation[0],), eval_y=(validation[1],),
                  callbacks=[early_stopping(30, verbose=False)])
    else:
        model.fit(*train)
    return model
