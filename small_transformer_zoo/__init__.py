"""Small Transformer Zoo: populations of trained small transformers as a dataset, and the weight space view."""

import atexit
import gc

from .architecture import ArchitectureSpec, ParameterInfo, mnist_spec, text_spec
from .errors import ZooFormatError, ZooReplacedError
from .hub import DEFAULT_REPO_ID, as_zoo, load_dataset, open_zoo, open_zoos, resolve_zoo
from .reader import SplitWeights, WeightSpaceDataset, Zoo
from .splits import assign_split
from .weight_space import (
    BlockWeights,
    TransformerWeights,
    WeightSpaceBatch,
    WeightSpaceCollator,
    pack_state_dict,
    unpack_params,
)
from .writer import ZooWriter

__all__ = [
    "ArchitectureSpec", "ParameterInfo", "mnist_spec", "text_spec", "ZooFormatError", "ZooReplacedError",
    "DEFAULT_REPO_ID",
    "load_dataset", "as_zoo", "open_zoo", "open_zoos", "resolve_zoo", "SplitWeights", "WeightSpaceDataset", "Zoo",
    "assign_split", "BlockWeights",
    "TransformerWeights", "WeightSpaceBatch", "WeightSpaceCollator", "pack_state_dict", "unpack_params",
    "ZooWriter",
]

# Arrow objects left in reference cycles were collected only during interpreter teardown, after torch's and
# pyarrow's own exit handlers, and then about one process in two aborted ("terminate called without an active
# exception", exit code 134) after its work was done. Registered after both libraries are imported, this
# collection runs before their handlers (atexit runs last-registered first).
atexit.register(gc.collect)
