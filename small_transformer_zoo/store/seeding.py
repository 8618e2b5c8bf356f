"""A zoo's seed policy (docs/design.md section 5): whether its runs are independent draws or share one seed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa


def seed_policy(manifest: Mapping[str, Any], tables: Iterable[pa.Table]) -> str:
    """The policy a build recorded in its manifest, else the one the metadata's `seed` column shows: `shared` (one
    seed for every run, as in the original release), `per-run` (every run its own), `mixed`, or `unknown` (no
    seeds recorded)."""
    recorded = (manifest.get("provenance") or {}).get("seed_policy")
    if isinstance(recorded, str):
        return recorded
    seeds: dict[str, Any] = {}
    for table in tables:
        part = table.select(["run_id", "seed"])
        seeds.update(zip(part.column("run_id").to_pylist(), part.column("seed").to_pylist()))
    known = [s for s in seeds.values() if s is not None]
    if not known:
        return "unknown"
    counts = Counter(known)
    if len(counts) == 1 and len(known) > 1:
        return "shared"
    if len(counts) == len(known) == len(seeds):
        return "per-run"
    return "mixed"
