"""The package's architecture, read from its source: no import cycle (module-level or inside a function), and the
dependencies between layers pointing one way (docs/design.md section 1)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import PROJECT

PACKAGES = ("small_transformer_zoo", "builders", "nfn_baselines", "stz_workflows")
# Which layers of the core each layer may import (itself always).
CORE_LAYERS = {
    "format": {"errors"},
    "weights": {"errors", "format"},
    "store": {"errors", "format", "weights"},
    "hub": {"errors", "format", "weights", "store"},
    "original": {"errors", "format", "weights", "store", "devices"},
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PROJECT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (PROJECT / package).rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str], type_checking: bool = True) -> set[str]:
    """Project modules that `name` imports anywhere in its source; `type_checking=False` leaves out the imports
    made for type checkers only."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    tree = ast.parse(path.read_text())
    skip = set() if type_checking else {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(type_checking: bool = True) -> dict[str, set[str]]:
    """Module -> the project modules it imports, type-checking imports included unless asked otherwise."""
    modules = project_modules()
    known = set(modules)
    # A package's own __init__ is not an edge worth following: importing `a.b.c` runs `a.b` first anyway.
    return {name: {t for t in imports_of(name, path, known, type_checking) if not name.startswith(t + ".")}
            for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle() -> None:
    """Not even through imports made for type checkers only: a cycle hidden behind TYPE_CHECKING is still two
    modules that cannot be understood apart."""
    assert cycles(import_graph()) == []


def test_the_cycle_check_sees_type_checking_imports(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg import other\n")
    assert imports_of("pkg.mod", source, {"pkg.other", "pkg.mod"}) == {"pkg.other"}
    assert imports_of("pkg.mod", source, {"pkg.other", "pkg.mod"}, type_checking=False) == set()


NFN_LAYERS = {"models": set(), "bench": {"models"}, "leaderboard": {"models", "bench"}}


def test_nfn_baselines_subpackages_point_one_way() -> None:
    """bench and leaderboard use models; models uses neither; bench never uses leaderboard."""
    wrong = []
    for module, targets in import_graph().items():
        parts = module.split(".")
        if parts[0] != "nfn_baselines" or len(parts) < 3 or parts[1] not in NFN_LAYERS:
            continue
        allowed = NFN_LAYERS[parts[1]] | {parts[1]}
        wrong += [(module, t) for t in targets if t.split(".")[0] == "nfn_baselines"
                  and (len(t.split(".")) < 3 or t.split(".")[1] not in allowed)]
    assert wrong == []


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "small_transformer_zoo" or len(parts) < 2:
        return None
    return parts[1]


def test_layers_point_one_way() -> None:
    wrong = []
    for module, targets in import_graph().items():
        layer = layer_of(module)
        if module.split(".")[0] == "small_transformer_zoo":
            wrong += [(module, t) for t in targets if t.split(".")[0] != "small_transformer_zoo"]
        if layer in CORE_LAYERS:
            allowed = CORE_LAYERS[layer] | {layer}
            wrong += [(module, t) for t in targets if layer_of(t) not in allowed]
    assert wrong == []


def test_builders_and_predictors_do_not_import_each_other() -> None:
    graph = import_graph()
    crossing = [(m, t) for m, ts in graph.items() for t in ts
                if {m.split(".")[0], t.split(".")[0]} == {"builders", "nfn_baselines"}]
    assert crossing == []


@pytest.mark.parametrize("statement", ["import small_transformer_zoo", "import small_transformer_zoo.cli",
                                       "from small_transformer_zoo.testing import free_loopback_port"])
def test_package_root_loads_neither_torch_nor_datasets(statement: str) -> None:
    """Nor `huggingface_hub`, which reads HF_ENDPOINT once at import: the tests' port must be chosen first."""
    code = f"{statement}; import sys; print(sorted(m for m in ('torch', 'datasets', 'huggingface_hub') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PROJECT)
    assert result.stdout.strip() == "[]"


def test_lazy_names_are_the_documented_api() -> None:
    import small_transformer_zoo as stz

    assert set(stz.__all__) == set(stz._EXPORTS)
    for name in stz.__all__:
        assert getattr(stz, name) is not None
    with pytest.raises(AttributeError):
        stz.no_such_name  # noqa: B018


def test_earlier_flat_module_paths_still_import_with_a_deprecation_warning() -> None:
    """Users' scripts that import `nfn_baselines.predictors` or `nfn_baselines.leaderboard.add_result` keep working
    for one release: the same module or function, and a DeprecationWarning naming where it went."""
    check = """
import importlib, sys, warnings
from nfn_baselines import MOVED
for old, new in MOVED.items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(f"nfn_baselines.{old}")
    assert module is importlib.import_module(f"nfn_baselines.{new}"), old
    assert any(issubclass(w.category, DeprecationWarning) and f"nfn_baselines.{new}" in str(w.message)
               for w in caught), old
    assert module.__spec__.name == f"nfn_baselines.{new}"
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    from nfn_baselines.leaderboard import add_result, write_submission
from nfn_baselines.leaderboard.scoring import add_result as moved
from nfn_baselines.bench.submission import write_submission as written
assert add_result is moved and write_submission is written
assert sum(issubclass(w.category, DeprecationWarning) for w in caught) >= 2
try:
    import nfn_baselines.no_such_module
except ModuleNotFoundError:
    pass
else:
    raise AssertionError("an unknown name imported")
print("ok", len(MOVED))
"""
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, cwd=PROJECT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("ok 20")
