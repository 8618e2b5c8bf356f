"""Small Transformer Zoo: populations of trained small transformers as a dataset, and the weight space view.

The package is four layers, each a folder, each depending only on the ones before it: `format` (what a zoo is on
disk: architecture, manifest, metadata, shards, splits, selection), `weights` (the weight-space view, collation,
the symmetry group, canonical forms, standardisation, the zoo model), `store` (a local zoo: reading, writing,
verifying, the card) and `hub` (finding a zoo by name or repo id, opening it, `load_dataset`, the `datasets`
builder, remote reads, push).

A zoo has two front doors: `open_zoo` (a local folder, a Hub repo id or the short name, as a `Zoo`) and
`load_dataset` (the same names, as a `datasets` object). Errors come by kind under `ZooFormatError`
(`small_transformer_zoo.errors`).

The names below are imported on first use (PEP 562), so `import small_transformer_zoo` stays fast and loads
neither torch nor `datasets` until a name that needs them is used. `_EXPORTS` is the one list of them: `__all__`
is made from it, and a test checks the type-checking imports against it.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import warnings
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "ArchitectureSpec": "format.architecture", "ParameterInfo": "format.architecture",
    "mnist_spec": "format.architecture", "text_spec": "format.architecture",
    "assign_split": "format.splits",
    "ZooFormatError": "errors", "ZooNotFoundError": "errors", "ZooArgumentError": "errors",
    "ZooDamagedError": "errors", "ZooHubError": "errors", "ZooReplacedError": "errors",
    "DEFAULT_REPO_ID": "store.local_index",
    "open_zoo": "hub.opening", "load_dataset": "hub.load",
    "SplitWeights": "store.reader", "WeightSpaceDataset": "store.reader", "Zoo": "store.reader",
    "ZooWriter": "store.writer",
    "BlockWeights": "weights.weight_space", "TransformerWeights": "weights.weight_space",
    "pack_state_dict": "weights.weight_space", "unpack_params": "weights.weight_space",
    "WeightSpaceBatch": "weights.collate", "WeightSpaceCollator": "weights.collate",
}
# Ways to a zoo that earlier releases exported here, as (module, the object now behind the name, what to use): they
# still work for one release, with a warning naming the front door.
_DEPRECATED = {
    "as_zoo": ("hub.opening", "open_zoo", "open_zoo, which takes a Zoo as well as a name"),
    "open_zoos": ("hub.opening", "_open_configs", "open_zoo with a config"),
    "resolve_zoo": ("hub.locate", "resolve_zoo", "open_zoo"),
}
__all__ = list(_EXPORTS)

if TYPE_CHECKING:
    from .errors import (ZooArgumentError, ZooDamagedError, ZooFormatError, ZooHubError, ZooNotFoundError,
                         ZooReplacedError)
    from .format.architecture import ArchitectureSpec, ParameterInfo, mnist_spec, text_spec
    from .format.splits import assign_split
    from .hub.load import load_dataset
    from .hub.opening import open_zoo
    from .store.local_index import DEFAULT_REPO_ID
    from .store.reader import SplitWeights, WeightSpaceDataset, Zoo
    from .store.writer import ZooWriter
    from .weights.collate import WeightSpaceBatch, WeightSpaceCollator
    from .weights.weight_space import BlockWeights, TransformerWeights, pack_state_dict, unpack_params


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED:
        module, target, instead = _DEPRECATED[name]
        warnings.warn(f"small_transformer_zoo.{name} is deprecated and leaves the package root in the next release; "
                      f"use {instead}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(f".{module}", __name__), target)
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


# Arrow objects left in reference cycles were collected only during interpreter teardown, after torch's and
# pyarrow's own exit handlers, and then about one process in two aborted ("terminate called without an active
# exception", exit code 134) after its work was done. Registered before either library is imported (atexit runs
# the last-registered handler first), this collection would run after theirs: the layers that load pyarrow
# register it again (`register_exit_collection`) once they have imported it.
def register_exit_collection() -> None:
    """Collect garbage at exit before the handlers of the libraries imported so far run."""
    atexit.unregister(gc.collect)
    atexit.register(gc.collect)
