"""Test support shipped with the package, in one place, for this package's tests and benchmarks and for users'
own: a Hugging Face Hub stand-in on 127.0.0.1 (`HubServer`), so code that reads or publishes zoos runs against a
real HTTP server without a network; small synthetic zoos (`synthetic_zoo`), releases in the authors' layout
(`synthetic_release`) and weights that carry a learnable label (`labelled_weights`).

`huggingface_hub` reads `HF_ENDPOINT` once, at import: pick a free port (`free_loopback_port()`), set
`HF_ENDPOINT=http://127.0.0.1:<port>` first, then use `HubServer(port)` (see tests/conftest.py). `HubServer` is
imported on first use, so the other modules here can be imported before `HF_ENDPOINT` is set.
"""

from __future__ import annotations

import socket
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .hub_server import HubServer

__all__ = ["HubServer", "free_loopback_port"]


def free_loopback_port() -> int:
    """A TCP port on 127.0.0.1 that no one listens on now, for a `HubServer`."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def __getattr__(name: str) -> Any:
    if name != "HubServer":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .hub_server import HubServer

    return HubServer
