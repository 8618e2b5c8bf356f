"""The predictor registry: every model the benchmark can train, by name, with its constructor and default settings.

The benchmark, the `stz bench --models` choices and its default list all read this registry, so a new predictor is
one `register_predictor(...)` call (CONTRIBUTING.md, "Add a predictor"). A neural predictor is an `nn.Module` that
maps a `TransformerWeights` batch to predicted accuracies in [0, 1] and is trained by `train.train_predictor`; a
tree predictor is a scikit-learn-style regressor on the flattened weights, fitted by its own `fit` (which may use
the validation split, e.g. for early stopping).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import numpy as np
    from torch import nn

    from small_transformer_zoo.format.architecture import ArchitectureSpec

    Arrays = tuple[np.ndarray, np.ndarray]

from small_transformer_zoo.format.architecture import COMPONENTS

# The model classes (and torch) load when a predictor is built, not when the registry is read: the command line
# lists the registered names in its help.


@dataclass(frozen=True)
class Predictor:
    """One registered model.

    `build(spec, settings)` makes a neural model; `fit(seed, n_jobs, train, validation, settings)` returns a
    fitted tree model with `predict`. `settings` are the defaults a benchmark row may override (the ablations do).
    """

    name: str
    kind: Literal["neural", "tree"]
    description: str
    build: Callable[[ArchitectureSpec, Mapping[str, Any]], nn.Module] | None = None
    fit: Callable[[int, int, Arrays, Arrays, Mapping[str, Any]], Any] | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    default: bool = True

    def __post_init__(self) -> None:
        if (self.kind == "neural") != (self.build is not None) or (self.kind == "tree") != (self.fit is not None):
            raise ValueError(f"predictor {self.name!r}: a neural predictor needs `build`, a tree predictor `fit`")


PREDICTORS: dict[str, Predictor] = {}


def register_predictor(predictor: Predictor) -> Predictor:
    """Add a predictor to the registry (a name already taken is an error)."""
    if predictor.name in PREDICTORS:
        raise ValueError(f"a predictor named {predictor.name!r} is already registered")
    PREDICTORS[predictor.name] = predictor
    return predictor


def get_predictor(name: str) -> Predictor:
    if name not in PREDICTORS:
        raise ValueError(f"unknown model {name!r}; choose from {list(PREDICTORS)}")
    return PREDICTORS[name]


def default_predictors() -> list[str]:
    """The models `stz bench` runs when none are named, in table order."""
    return [name for name, p in PREDICTORS.items() if p.default]


def _tree(name: str) -> Callable[[int, int, Arrays, Arrays, Mapping[str, Any]], Any]:
    def fit(seed: int, n_jobs: int, train: Arrays, validation: Arrays, settings: Mapping[str, Any]) -> Any:
        from .baselines import fit_tree, tree_model

        return fit_tree(tree_model(name, seed, n_jobs=n_jobs, **settings), name, train, validation)

    return fit


def _transformer_nfn(spec: ArchitectureSpec, s: Mapping[str, Any]) -> nn.Module:
    from .model import TransformerNFN

    return TransformerNFN(spec, channels=s["channels"], hidden=s["hidden"], num_layers=s["layers"],
                          components=s["components"])


def _flat(mode: str) -> Callable[[ArchitectureSpec, Mapping[str, Any]], nn.Module]:
    def build(spec: ArchitectureSpec, s: Mapping[str, Any]) -> nn.Module:
        from .baselines import FlatPredictor

        return FlatPredictor(spec, mode=mode, components=s["components"])

    return build


register_predictor(Predictor(
    "transformer_nfn", "neural", "Transformer-NFN: equivariant layers over the encoder, MLPs over embedding and "
    "classifier (docs/design.md section 8)", build=_transformer_nfn,
    settings={"channels": 10, "hidden": 10, "layers": 1, "components": COMPONENTS}))
register_predictor(Predictor(
    "mlp", "neural", "each component's flattened weights through its own MLP of width 50", build=_flat("mlp"),
    settings={"components": COMPONENTS}))
register_predictor(Predictor(
    "statnn", "neural", "mean, variance and five quantiles of every tensor through an MLP of width 256",
    build=_flat("statnn"), settings={"components": COMPONENTS}))
for _name, _what in (("xgboost", "XGBoost (CPU build)"), ("lightgbm", "LightGBM"),
                     ("random_forest", "scikit-learn's Random Forest")):
    register_predictor(Predictor(_name, "tree", f"{_what} on the flattened weights", fit=_tree(_name)))
