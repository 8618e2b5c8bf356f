"""The leaderboard: submissions checked and scored (`scoring`), the results store, and the Hub leaderboard's pull
requests (`hub`); submissions are parsed in a child process (`parquet_child`).

Names imported from `nfn_baselines.leaderboard` itself, as when it was one module, still resolve with a
DeprecationWarning naming their new module; they go in the next release.
"""

from __future__ import annotations

import importlib
import warnings
from typing import Any

_FORMER = {"write_submission": "nfn_baselines.bench.submission"}


def __getattr__(name: str) -> Any:
    home = _FORMER.get(name, "nfn_baselines.leaderboard.scoring")
    module = importlib.import_module(home)
    if name.startswith("__") or not hasattr(module, name):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warnings.warn(f"{__name__}.{name} has moved to {home}.{name}; the old path goes in the next release",
                  DeprecationWarning, stacklevel=2)
    return getattr(module, name)
