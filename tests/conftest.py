"""Shared fixtures. HF_ENDPOINT (the loopback Hub's port, chosen first) and the caches are set before
`huggingface_hub` is imported anywhere, because the library reads them once, at import time."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from small_transformer_zoo.testing import free_loopback_port

_SESSION_DIR = Path(tempfile.mkdtemp(prefix="stz-tests-"))
_PORT = free_loopback_port()
os.environ.update(HF_ENDPOINT=f"http://127.0.0.1:{_PORT}", HF_HUB_DISABLE_XET="1", HF_HUB_DISABLE_TELEMETRY="1",
                  HF_HOME=str(_SESSION_DIR / "hf-home"), HF_DATASETS_CACHE=str(_SESSION_DIR / "hf-datasets"),
                  STZ_HOME=str(_SESSION_DIR / "stz-home"))
os.environ.pop("STZ_REPO_ID", None)

from small_transformer_zoo.testing import HubServer  # noqa: E402  (imports huggingface_hub: after HF_ENDPOINT)

HUB = HubServer(_PORT)
pytest_plugins = ["tests.slow_marker", "tests.returned_heap", "pytester"]


def pytest_configure(config: pytest.Config) -> None:
    HUB.__enter__()


def pytest_unconfigure(config: pytest.Config) -> None:
    HUB.__exit__(None, None, None)
    shutil.rmtree(_SESSION_DIR, ignore_errors=True)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that uses the loopback Hub is marked `hub` (select or deselect them with -m)."""
    for item in items:
        if "hub" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.hub)


@pytest.fixture
def hub() -> HubServer:
    HUB.requests.clear()
    return HUB


@pytest.fixture
def stz_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private STZ_HOME (registry, verification stamps) for one test."""
    home = tmp_path / "stz-home"
    monkeypatch.setenv("STZ_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def synthetic_root() -> Path:
    """A small synthetic zoo shared read-only by many tests (several shards per split)."""
    from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

    root = _SESSION_DIR / "synthetic-zoo"
    write_synthetic_zoo(root, "syn", runs=24, shard_size=10, register=False)
    return root


@pytest.fixture
def zoo_copy(synthetic_root: Path, tmp_path: Path) -> Path:
    """A private copy of the synthetic zoo that a test may damage."""
    target = tmp_path / "zoo"
    shutil.copytree(synthetic_root, target)
    return target


@pytest.fixture(scope="module")
def small_data():
    """The embedded MNIST cut to 300 training, 64 validation and 64 test images: trainer tests in seconds."""
    from builders.data import load_embedded_mnist

    data = load_embedded_mnist()
    data.train_x, data.train_y = data.train_x[:300], data.train_y[:300]
    data.validation_x, data.validation_y = data.validation_x[:64], data.validation_y[:64]
    data.test_x, data.test_y = data.test_x[:64], data.test_y[:64]
    return data
