"""The predictor registry: every model the benchmark can train, by name, with its constructor and default settings.

The benchmark, the `stz bench --models` choices and its default list all read this registry, so a new predictor is
one `register_predictor(...)` call (CONTRIBUTING.md, "Add a predictor"). Three kinds:

- neural: `build(spec, settings, outputs)` makes an `nn.Module` that maps a `TransformerWeights` batch to the
  target (`outputs` values per checkpoint), trained by `train.train_predictors`;
- tree: a scikit-learn-style model on the flattened weights, fitted by `fit` (which may use the validation split,
  e.g. for early stopping);
- floor: a reference row that says what the weights add: the L2 norm of the weights (no training), the
  checkpoint's epoch, a model of the run's hyperparameters and epoch alone, or the nearest training checkpoint's
  target (what memorising reaches). A weight-space model that does not
  beat the hyperparameters-only floor has learned nothing from the weights that the training config did not say.

A predictor that is `seeded=False` gives the same result for every seed (boosted trees without subsampling, the
floors): the benchmark fits it once and says so.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from small_transformer_zoo.format.architecture import COMPONENTS

from .fitting import FitRequest

if TYPE_CHECKING:
    from torch import nn

    from small_transformer_zoo.format.architecture import ArchitectureSpec


# The model classes (and torch) load when a predictor is built, not when the registry is read: the command line
# lists the registered names in its help.


@dataclass(frozen=True)
class Predictor:
    """One registered model (module docstring). `settings` are the defaults a benchmark row may override (the
    ablations do); `invariant`: the model's output is unchanged by the symmetry group (tested)."""

    name: str
    kind: Literal["neural", "tree", "floor"]
    description: str
    build: Callable[[ArchitectureSpec, Mapping[str, Any], int], nn.Module] | None = None
    fit: Callable[[FitRequest], Any] | None = None
    settings: Mapping[str, Any] = field(default_factory=dict)
    default: bool = True
    seeded: bool = True
    invariant: bool = False
    classifies: bool = True  # it can predict a class target
    ranks_only: bool = False  # its values order checkpoints but are not in the target's unit (no R^2, no L1)
    reads: tuple[str, ...] = ()  # metadata columns it predicts from: it is not defined for a target made of them
    training: Mapping[str, Any] = field(default_factory=dict)  # a fixed training recipe (TrainConfig fields)

    def __post_init__(self) -> None:
        if (self.kind == "neural") != (self.build is not None) or (self.kind != "neural") != (self.fit is not None):
            raise ValueError(f"predictor {self.name!r}: a neural predictor needs `build`, the others `fit`")


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


def floor_predictors() -> list[str]:
    """The reference rows every table carries (`stz bench --no-floors` leaves them out)."""
    return [name for name, p in PREDICTORS.items() if p.kind == "floor" and p.default]


def _transformer_nfn(statistics: bool, interfaces: bool = False
                     ) -> Callable[[ArchitectureSpec, Mapping[str, Any], int], nn.Module]:
    def build(spec: ArchitectureSpec, s: Mapping[str, Any], outputs: int) -> nn.Module:
        from .model import TransformerNFN

        return TransformerNFN(spec, channels=s["channels"], hidden=s["hidden"], num_layers=s["layers"],
                              components=s["components"], outputs=outputs, head_dropout=s["head_dropout"],
                              statistics=statistics, recipe=s.get("recipe", "package"), interfaces=interfaces)
    return build


def _flat(mode: str) -> Callable[[ArchitectureSpec, Mapping[str, Any], int], nn.Module]:
    def build(spec: ArchitectureSpec, s: Mapping[str, Any], outputs: int) -> nn.Module:
        from .baselines import FlatPredictor

        return FlatPredictor(spec, mode=mode, components=s["components"], outputs=outputs,
                             head_dropout=s["head_dropout"])
    return build


def _probegen(spec: ArchitectureSpec, s: Mapping[str, Any], outputs: int) -> nn.Module:
    from .probegen import ProbeGen

    return ProbeGen(spec, probes=s["probes"], outputs=outputs, head_dropout=s["head_dropout"])


def _tree(name: str) -> Callable[[FitRequest], Any]:
    def fit(request: FitRequest) -> Any:
        from .baselines import fit_tree, tree_model

        model = tree_model(name, request.seed, n_jobs=request.n_jobs,
                           classification=request.target.kind == "classification", **request.settings)
        return fit_tree(model, name, request.train, request.validation, classes=len(request.target.classes),
                        progress=request.progress)
    return fit


def _floor(name: str) -> Callable[[FitRequest], Any]:
    def fit(request: FitRequest) -> Any:
        from .floors import fit_floor

        return fit_floor(name, request)
    return fit


NEURAL = {"components": COMPONENTS, "head_dropout": 0.0}
NFN = {"channels": 10, "hidden": 10, "layers": 1, **NEURAL}

register_predictor(Predictor(
    "transformer_nfn", "neural", "Transformer-NFN: equivariant layers over the encoder, MLPs over embedding and "
    "classifier (docs/design.md section 8)", build=_transformer_nfn(False), settings=NFN, invariant=True))
register_predictor(Predictor(
    "transformer_nfn_paper", "neural", "Transformer-NFN as the paper builds and trains it: sums, LayerNorms per block "
    "and in the head, one linear layer over the embedding; 50 epochs (10 of warm-up) of batches of 16, Adam at 1e-3 "
    "(docs/design.md section 8)", build=_transformer_nfn(False), settings={**NFN, "recipe": "paper"},
    invariant=True, default=False,
    training={"epochs": 50, "warmup_epochs": 10, "batch_size": 16, "lr": 1e-3, "weight_decay": 0.0}))
register_predictor(Predictor(
    "transformer_nfn_interfaces", "neural", "Transformer-NFN fed the features between blocks in a canonical order, "
    "so that it is invariant to the interface permutations as well as the paper's group (docs/design.md section 8)",
    build=_transformer_nfn(False, interfaces=True), settings=NFN, invariant=True, default=False))
register_predictor(Predictor(
    "nfn_hybrid", "neural", "Transformer-NFN with a branch over the invariant statistics before its head",
    build=_transformer_nfn(True), settings=NFN, invariant=True))
register_predictor(Predictor(
    "mlp", "neural", "each component's flattened weights through its own MLP of width 50", build=_flat("mlp"),
    settings=NEURAL))
register_predictor(Predictor(
    "statnn", "neural", "mean, variance and five quantiles of every tensor through an MLP of width 256",
    build=_flat("statnn"), settings=NEURAL))
register_predictor(Predictor(
    "statnn_invariant", "neural", "STATNN's statistics of quantities the symmetry group leaves unchanged: per-head "
    "QK and VO products (singular values, entries), MLP tensors, embedding, classifier (docs/design.md section 9)",
    build=_flat("statnn_invariant"), settings=NEURAL, invariant=True))
register_predictor(Predictor(
    "statnn_probe", "neural", "statnn_invariant's statistics and those of the network's outputs on 256 fixed random "
    "probe inputs, which the group cannot change because it keeps the function (docs/design.md section 9)",
    build=_flat("statnn_probe"), settings=NEURAL, invariant=True))
register_predictor(Predictor(
    "probegen", "neural", "ProbeGen: 8 probe inputs made by a learned deep linear generator, the network's class "
    "probabilities on them through an MLP, trained end to end (docs/design.md section 9)", build=_probegen,
    # 8 probes: tied with 32 on both `families` zoos, at a fifth of the step's cost (BENCHMARKS.md).
    settings={"probes": 8, "head_dropout": 0.0}, invariant=True, default=False))
for _name, _what, _seeded in (("xgboost", "XGBoost (CPU build)", False), ("lightgbm", "LightGBM", False),
                              ("random_forest", "scikit-learn's Random Forest", True)):
    register_predictor(Predictor(_name, "tree", f"{_what} on the flattened weights", fit=_tree(_name),
                                 seeded=_seeded))
register_predictor(Predictor(
    "l2_norm", "floor", "floor: the L2 norm of all weights, no training (its sign chosen on the training split)",
    fit=_floor("l2_norm"), seeded=False, classifies=False, ranks_only=True))
register_predictor(Predictor(
    "epoch", "floor", "floor: the checkpoint's epoch, no weights (its sign chosen on the training split)",
    fit=_floor("epoch"), seeded=False, classifies=False, ranks_only=True, reads=("epoch",)))
register_predictor(Predictor(
    "hyperparameters", "floor", "floor: LightGBM on the run's hyperparameters and the checkpoint's epoch, no "
    "weights (the target's own columns left out)", fit=_floor("hyperparameters"), seeded=False))
register_predictor(Predictor(
    "nearest_run", "floor", "floor: the target of the nearest training checkpoint in weight space, no learning "
    "(near 1 where test runs have near-clones in training)", fit=_floor("nearest_run"), seeded=False))
