"""The package root: one export list (`_EXPORTS`) that `__all__`, the type-checking imports and the lazy
attributes all follow, and the deprecated ways to a zoo that still work with a warning."""

from __future__ import annotations

import ast
import importlib
import warnings
from pathlib import Path

import pytest

import small_transformer_zoo as stz

ROOT_INIT = Path(stz.__file__)


def _type_checking_imports() -> dict[str, str]:
    tree = ast.parse(ROOT_INIT.read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    return {alias.asname or alias.name: node.module for node in block.body if isinstance(node, ast.ImportFrom)
            for alias in node.names}


def test_the_export_list_is_written_once() -> None:
    assert stz.__all__ == list(stz._EXPORTS)
    assert _type_checking_imports() == stz._EXPORTS
    assert not set(stz._DEPRECATED) & set(stz._EXPORTS)


@pytest.mark.parametrize("name", sorted(stz._EXPORTS))
def test_every_export_is_its_module_s_object(name: str) -> None:
    module = importlib.import_module(f"small_transformer_zoo.{stz._EXPORTS[name]}")
    assert getattr(stz, name) is getattr(module, name)


@pytest.mark.parametrize("name", sorted(stz._DEPRECATED))
def test_a_deprecated_way_to_a_zoo_still_works_with_a_warning(name: str) -> None:
    module_name, target, _ = stz._DEPRECATED[name]
    module = importlib.import_module(f"small_transformer_zoo.{module_name}")
    with pytest.warns(DeprecationWarning, match=f"small_transformer_zoo.{name} is deprecated.*use "):
        assert getattr(stz, name) is getattr(module, target)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stz.open_zoo, stz.load_dataset  # the front doors warn about nothing


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'open_zooo'"):
        stz.open_zooo  # noqa: B018
