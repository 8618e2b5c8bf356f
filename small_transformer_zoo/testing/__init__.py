"""Test support shipped with the package: a Hugging Face Hub stand-in on 127.0.0.1 (`HubServer`), so code that
reads or publishes zoos, this package's tests and benchmarks included, runs against a real HTTP server without a
network. `huggingface_hub` reads `HF_ENDPOINT` once, at import, and this package imports it: pick a free port, set
`HF_ENDPOINT=http://127.0.0.1:<port>` first, then import this and start `HubServer(port)` (see tests/conftest.py).
"""

from .hub_server import HubServer

__all__ = ["HubServer"]
