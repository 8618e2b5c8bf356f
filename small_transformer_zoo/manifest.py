"""zoo.json: the manifest that makes a config folder a zoo, and the checks made when one is opened."""

from __future__ import annotations

import json
import os
import platform
from datetime import datetime, timezone
from importlib import metadata as importlib_metadata
from pathlib import Path
from typing import Any

from .architecture import ArchitectureSpec
from .errors import ZooFormatError

FORMAT_NAME = "small-transformer-zoo"
FORMAT_VERSION = 1
MANIFEST_NAME = "zoo.json"
REQUIRED_KEYS = ("format", "format_version", "config", "architecture", "parameters", "n_params", "splits",
                 "counts", "metadata", "shards")


def package_version() -> str:
    try:
        return importlib_metadata.version("small-transformer-zoo")
    except importlib_metadata.PackageNotFoundError:
        return "unknown"


def base_provenance() -> dict[str, Any]:
    """What made this zoo: package and library versions, machine, time."""
    import numpy
    import torch

    return {
        "created_by": f"small-transformer-zoo {package_version()}",
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "platform": platform.platform(),
    }


def check_manifest(manifest: Any, path: str) -> dict[str, Any]:
    """Check the manifest's format, version and required fields; return it."""
    if not isinstance(manifest, dict):
        raise ZooFormatError(path, "manifest is not a JSON object")
    if manifest.get("format") != FORMAT_NAME:
        raise ZooFormatError(path, f"field 'format' is {manifest.get('format')!r}, expected {FORMAT_NAME!r}")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise ZooFormatError(path, f"field 'format_version' is {version!r}; this package reads format version "
                                   f"{FORMAT_VERSION} (upgrade small-transformer-zoo for newer zoos)")
    missing = [key for key in REQUIRED_KEYS if key not in manifest]
    if missing:
        raise ZooFormatError(path, f"manifest lacks fields {missing}")
    try:
        spec = ArchitectureSpec.from_dict(manifest["architecture"])
    except (TypeError, ValueError) as exc:
        raise ZooFormatError(path, f"field 'architecture': {exc}") from None
    if spec.n_params != manifest["n_params"]:
        raise ZooFormatError(path, f"field 'n_params' is {manifest['n_params']}, the architecture has {spec.n_params}")
    return manifest


def load_manifest_text(text: str | bytes, path: str) -> dict[str, Any]:
    try:
        manifest = json.loads(text)
    except ValueError as exc:
        raise ZooFormatError(path, f"manifest is not valid JSON ({exc})") from None
    return check_manifest(manifest, path)


def load_manifest(config_dir: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(config_dir) / MANIFEST_NAME
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        raise ZooFormatError(path, "no zoo manifest here (is this a zoo config folder?)") from None
    return load_manifest_text(text, str(path))
