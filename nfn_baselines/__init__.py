"""Transformer-NFN, its baselines, the benchmark and the leaderboard, in three subpackages that depend one way:

- `nfn_baselines.models`: the predictors (Transformer-NFN's layers and model, the baselines, the floors), their
  registry, their training, the targets and metrics they are fitted and scored by;
- `nfn_baselines.bench`: the benchmark (data, protocols, runs, resume, report), on top of `models`;
- `nfn_baselines.leaderboard`: submissions, scoring, the results store and the Hub leaderboard, on top of both.

The modules' earlier flat paths (`nfn_baselines.predictors`, `nfn_baselines.benchmark`, ...) still import, with a
DeprecationWarning naming the new one; they go in the next release.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType
from typing import Any

MOVED = {
    "baselines": "models.baselines", "floors": "models.floors", "invariant_stats": "models.invariant_stats",
    "layers": "models.layers", "metrics": "models.metrics", "model": "models.model",
    "predictors": "models.predictors", "probe_features": "models.probe_features", "reference": "models.reference",
    "targets": "models.targets", "train": "models.train", "weight_stack": "models.weight_stack",
    "bench_data": "bench.data", "bench_resume": "bench.resume", "bench_runs": "bench.runs",
    "benchmark": "bench.benchmark", "protocols": "bench.protocols", "report": "bench.report",
    "hub_leaderboard": "leaderboard.hub", "parquet_child": "leaderboard.parquet_child",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports of an earlier flat path give the module at its new path, with a DeprecationWarning."""

    def __init__(self) -> None:
        self._specs: dict[str, tuple[Any, Any]] = {}  # old name -> the moved module's own spec and loader

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        package, _, old = name.partition(".")
        if package != __name__ or old not in MOVED:
            return None
        return importlib.util.spec_from_loader(name, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = f"{__name__}.{MOVED[spec.name.partition('.')[2]]}"
        warnings.warn(f"{spec.name} has moved to {new}; the old path goes in the next release", DeprecationWarning,
                      stacklevel=2)
        module = importlib.import_module(new)
        self._specs[spec.name] = (module.__spec__, module.__loader__)
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The module ran at its new path; give it back the spec the import system replaced."""
        for spec, loader in self._specs.values():
            if spec.name == module.__name__:
                module.__spec__, module.__loader__ = spec, loader


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())
