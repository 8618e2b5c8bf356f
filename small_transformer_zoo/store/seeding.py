"""A zoo's seed policy (docs/design.md section 5): whether its runs are independent draws or share one seed."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import pyarrow as pa


RECIPES = {1: "version 1: init cut at 2 std, dropout drawn from the data stream, warm-up to 0.91 of the rate, "
               "partial last batches",
           2: "version 2: the authors' initialisation, schedule and full batches; data and dropout streams apart"}


def seed_policy(manifest: Mapping[str, Any], tables: Iterable[pa.Table]) -> str:
    """The policy a build recorded in its manifest, with its shared seed (`shared (seed 3)`, `shared-init (seed
    7)`), else the one the metadata's `seed` column shows: `shared` (one seed for every run, as in the original
    release), `per-run` (every run its own), `mixed`, or `unknown` (no seeds recorded)."""
    provenance = manifest.get("provenance") or {}
    recorded = provenance.get("seed_policy")
    if isinstance(recorded, str):
        seed = provenance.get("shared_seed")
        return recorded if seed is None else f"{recorded} (seed {seed})"
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


def recipe(manifest: Mapping[str, Any]) -> str | None:
    """Which version of the package's training recipe built the zoo (`builders.trainer.RECIPE_VERSION`); a build
    that recorded none predates the versions and is version 1. None for a zoo no build made (an import, a
    synthetic zoo)."""
    plan = (manifest.get("provenance") or {}).get("build_plan")
    if not isinstance(plan, Mapping):
        return None
    version = plan.get("recipe_version", 1)
    return RECIPES.get(version, f"version {version}")
