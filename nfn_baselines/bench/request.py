"""What one benchmark run is asked (`BenchRequest`, the `stz bench` flags with their defaults) and what it trains
from that: the rows of the table (`ModelSpec`, with the ablations' NFN variants), the declared search of
`--tune`, and the network-epochs each fit costs (the unit of a run's progress and its estimate)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from small_transformer_zoo.devices import resolve_device
from small_transformer_zoo.format.architecture import COMPONENTS, ArchitectureSpec
from small_transformer_zoo.format.selection import normalise_where

from ..models.metrics import BOOTSTRAP_RESAMPLES, BOOTSTRAP_SEED, DEFAULT_THRESHOLDS
from ..models.predictors import default_predictors, floor_predictors, get_predictor
from .data import DataSelection

COMPONENT_ABLATION = (("encoder",), ("embedding",), ("classifier",), ("encoder", "embedding"),
                      ("encoder", "classifier"), ("embedding", "classifier"), COMPONENTS)
WIDTH_DEPTH_ABLATION = ((5, 1), (10, 1), (20, 1), (10, 2))
@dataclass
class ModelSpec:
    """One row of the table: a registered predictor (`nfn_baselines.predictors`) and the settings it overrides."""

    name: str
    predictor: str
    settings: dict[str, Any] = field(default_factory=dict)


def model_specs(models: Sequence[str] | None = None, ablation: str | None = None,
                spec: ArchitectureSpec | None = None) -> list[ModelSpec]:
    """Rows of the table: the named predictors (default: every default one), then an ablation's NFN variants. With
    the zoo's `spec`, the component ablation's variants are the subsets of the components its checkpoints hold
    (`ArchitectureSpec.stored_components`), each once; without it, every subset of `COMPONENTS`. The whole set is the
    `transformer_nfn` row itself."""
    names = default_predictors() if models is None else list(models)
    out = [ModelSpec(get_predictor(m).name, m) for m in names]
    if ablation == "components":
        held = set(spec.stored_components if spec is not None else COMPONENTS)
        subsets = [c for c in COMPONENT_ABLATION if set(c) <= held and set(c) != held]
        out += [ModelSpec(f"transformer_nfn[{'+'.join(c)}]", "transformer_nfn", {"components": c})
                for c in subsets]
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


def fixed_recipe_notes(models: list[str], epochs: int, tune: bool) -> list[str]:
    """One line for each named model that trains a fixed recipe, which `--epochs` (and `--tune`) do not change,
    where the run asks for something else: a quick run with `--epochs 1` would otherwise wait for the recipe's."""
    notes = []
    for name in dict.fromkeys(models):
        recipe = get_predictor(name).training
        if recipe and (tune or int(recipe.get("epochs", epochs)) != epochs):
            settings = ", ".join(f"{key} {value:g}" for key, value in recipe.items())
            asked = "--epochs and --tune say" if tune else "--epochs says"
            notes.append(f"{name} trains its fixed recipe ({settings}), whatever {asked}")
    return notes


def tuning_trials(epochs: int) -> list[dict[str, Any]]:
    """The declared search of `--tune`, the same for every neural model: learning rate, weight decay and epochs.
    The first trial is the untuned default."""
    return [{"lr": 1e-3, "weight_decay": 0.0, "epochs": epochs},
            {"lr": 3e-4, "weight_decay": 0.0, "epochs": epochs},
            {"lr": 3e-3, "weight_decay": 1e-4, "epochs": epochs},
            {"lr": 1e-3, "weight_decay": 1e-2, "epochs": max(1, epochs // 2)}]


@dataclass
class BenchRequest:
    """Everything one `stz bench` run is asked (the command line's flags), with its defaults. `device` "auto" is
    resolved here, once (CUDA when torch sees a GPU, else the CPU), as `BuildRequest` resolves a build's."""

    models: list[str] | None = None
    ablation: str | None = None
    seeds: int = 5
    epochs: int = 30
    preprocess: str = "none"
    protocol: str = "all-checkpoints"
    epoch: int | None = None
    where: dict[str, Any] = field(default_factory=dict)
    target: str = "test_accuracy"
    tune: bool = False
    resplit: int = 0
    train_runs: float = 1.0
    thresholds: tuple[float, ...] = DEFAULT_THRESHOLDS
    device: str = "auto"
    jobs: int = 1
    resamples: int = BOOTSTRAP_RESAMPLES
    bootstrap_seed: int = BOOTSTRAP_SEED
    settings: dict[str, Any] = field(default_factory=dict)  # head_dropout, weight_decay, patience overrides
    split_by: str | None = None      # "run" or "family": split the runs again with this unit (None: the zoo's own)
    randomize: str | None = None     # a symmetry group whose random elements move every checkpoint first
    floors: bool = False             # the reference rows (kind "floor") join named models (`stz bench` unless --no-floors)

    def __post_init__(self) -> None:
        normalise_where(self.where)  # a bad or reversed selection fails here, before any zoo is read
        self.device = str(resolve_device(self.device))
        if self.models is not None and self.floors:
            self.models = [*self.models, *(f for f in floor_predictors() if f not in self.models)]

    def data_selection(self, split_salt: str | None = None) -> DataSelection:
        """The data this run reads from its zoo (`read_bench_data`), its runs split again by `split_salt` if given."""
        return DataSelection(preprocess=self.preprocess, target=self.target, protocol=self.protocol, epoch=self.epoch,
                             where=self.where, split_salt=split_salt, train_runs=self.train_runs,
                             split_by=self.split_by, randomize=self.randomize)

    def seed_list(self) -> list[int]:
        """The seeds every model is trained with: 0 to `seeds` - 1."""
        return list(range(self.seeds))

    def model_rows(self, spec: ArchitectureSpec | None = None) -> list[ModelSpec]:
        """The rows of the table: the named (or default) predictors, then the ablation's NFN variants for a zoo of
        `spec` (`model_specs`)."""
        return model_specs(self.models, self.ablation, spec)

    def trials(self) -> list[dict[str, Any]]:
        """The training trials of every neural model: the declared search with `tune`, else its default."""
        return tuning_trials(self.epochs) if self.tune else tuning_trials(self.epochs)[:1]

    def fit_count(self, spec: ArchitectureSpec | None = None) -> int:
        """The (model, condition) fits the run trains on a zoo of `spec`: every model row on every condition of
        every split."""
        return len(self.model_rows(spec)) * self._conditions()

    def expected_epochs(self, spec: ArchitectureSpec | None = None) -> dict[str, int]:
        """Per model row, the network-epochs all its fits train at most (`benchmark.expected_epochs`): the unit
        of a benchmark's progress and of its time estimate."""
        return {m.name: expected_epochs(m, self.epochs, self.seeds, self.tune) * self._conditions()
                for m in self.model_rows(spec)}

    def _conditions(self) -> int:
        return (1 + (len(self.thresholds) if self.protocol == "paper" else 0)) * (1 + self.resplit)

    def stem(self, config: str) -> str:
        """The results' file name: the config, then what differs from the default run."""
        parts = [config, "bench"]
        parts += [self.protocol] if self.protocol != "all-checkpoints" else []
        parts += [self.target] if self.target != "test_accuracy" else []
        parts += ["tuned"] if self.tune else []
        parts += [f"train{self.train_runs:g}"] if self.train_runs < 1 else []
        parts += [f"split-by-{self.split_by}"] if self.split_by else []
        parts += [f"randomized-{self.randomize}"] if self.randomize else []
        return "-".join(parts)
