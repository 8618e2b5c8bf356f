"""Small Transformer Zoo: populations of trained small transformers as a dataset, and the weight space view.

The package is four layers, each a folder: `format` (what a zoo is on disk: architecture, manifest, metadata,
shards, splits, selection), `store` (a local zoo: reading, writing, verifying, the card), `hub` (finding a zoo by
name or repo id, `load_dataset`, the `datasets` builder, remote reads, push) and `weights` (the weight-space view,
collation, the symmetry group, canonical forms, standardisation, the zoo model). Each depends only on the layers
before it.

The names below are imported on first use (PEP 562), so `import small_transformer_zoo` stays fast and loads
neither torch nor `datasets` until a name that needs them is used.
"""

from __future__ import annotations

import atexit
import gc
import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "ArchitectureSpec": "format.architecture", "ParameterInfo": "format.architecture",
    "mnist_spec": "format.architecture", "text_spec": "format.architecture",
    "assign_split": "format.splits",
    "ZooFormatError": "errors", "ZooReplacedError": "errors",
    "DEFAULT_REPO_ID": "store.local_index", "resolve_zoo": "hub.locate",
    "load_dataset": "hub.load", "as_zoo": "hub.load", "open_zoo": "hub.load", "open_zoos": "hub.load",
    "SplitWeights": "store.reader", "WeightSpaceDataset": "store.reader", "Zoo": "store.reader",
    "ZooWriter": "store.writer",
    "BlockWeights": "weights.weight_space", "TransformerWeights": "weights.weight_space",
    "pack_state_dict": "weights.weight_space", "unpack_params": "weights.weight_space",
    "WeightSpaceBatch": "weights.collate", "WeightSpaceCollator": "weights.collate",
}
__all__ = [
    "ArchitectureSpec", "ParameterInfo", "mnist_spec", "text_spec", "assign_split", "ZooFormatError",
    "ZooReplacedError", "DEFAULT_REPO_ID", "resolve_zoo", "load_dataset", "as_zoo", "open_zoo", "open_zoos",
    "SplitWeights", "WeightSpaceDataset", "Zoo", "ZooWriter", "BlockWeights", "TransformerWeights",
    "pack_state_dict", "unpack_params", "WeightSpaceBatch", "WeightSpaceCollator",
]

if TYPE_CHECKING:
    from .errors import ZooFormatError, ZooReplacedError
    from .format.architecture import ArchitectureSpec, ParameterInfo, mnist_spec, text_spec
    from .format.splits import assign_split
    from .hub.load import as_zoo, load_dataset, open_zoo, open_zoos
    from .hub.locate import resolve_zoo
    from .store.local_index import DEFAULT_REPO_ID
    from .store.reader import SplitWeights, WeightSpaceDataset, Zoo
    from .store.writer import ZooWriter
    from .weights.collate import WeightSpaceBatch, WeightSpaceCollator
    from .weights.weight_space import BlockWeights, TransformerWeights, pack_state_dict, unpack_params


def __getattr__(name: str) -> Any:
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
