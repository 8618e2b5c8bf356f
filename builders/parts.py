"""A build's parts on disk: each finished group of runs saved as a part (`<out>/<config>/.build/parts/<group>.safetensors`
+ `.json`, written under a temporary name and renamed), read back, and assembled in run-id order into the zoo, so
an interrupted build ends with exactly the zoo an uninterrupted one writes; shards' parts join the same way."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save

from small_transformer_zoo.errors import ZooArgumentError, ZooDamagedError
from small_transformer_zoo.format.manifest import MANIFEST_NAME, load_manifest
from small_transformer_zoo.store.files import atomic_write_bytes, atomic_write_json
from small_transformer_zoo.store.writer import ZooWriter

from .grid import Run
from .plan import BuildPlan
from .request import Build
from .trainer import Checkpoint

PLAN_NAME = "plan.json"


def build_dir(out: Path, config: str) -> Path:
    return out / config / ".build"


def check_output(out: Path, plan: BuildPlan) -> bool:
    """True if the zoo is already built with this plan; errors if the folder holds another zoo or build."""
    config_dir = out / plan.config
    if (config_dir / MANIFEST_NAME).is_file():
        manifest = load_manifest(config_dir)
        if manifest["architecture"] != plan.architecture:
            raise ZooArgumentError(config_dir / MANIFEST_NAME, "holds a zoo of another architecture; choose another "
                                                             "--out or remove it")
        if manifest.get("provenance", {}).get("build_plan") == plan.to_dict():
            return True
        raise ZooArgumentError(config_dir / MANIFEST_NAME, "holds a zoo built with another plan (task, preset or "
                                                         "data differ); choose another --out or remove it")
    plan_path = build_dir(out, plan.config) / PLAN_NAME
    if plan_path.is_file():
        previous = json.loads(plan_path.read_text())
        if previous != plan.to_dict():
            raise ZooArgumentError(plan_path, "an unfinished build with another plan is here; choose another --out or "
                                            "remove the folder")
    return False


def save_part(folder: Path, gid: str, checkpoints: list[Checkpoint], device: str = "cpu",
              kernels: str | None = None) -> None:
    """Write one trained group; each record names the device type and the kernel set (`kernel_set`) it ran on."""
    records = [{"run": asdict(c.run), "epoch": c.epoch, "is_best": c.is_best, "metrics": c.metrics,
                "diverged": c.diverged, "device": device, "kernels": kernels} for c in checkpoints]
    params = np.stack([c.params for c in checkpoints]).astype(np.float32)
    atomic_write_bytes(folder / f"{gid}.safetensors", save({"params": params}))
    atomic_write_json(folder / f"{gid}.json", records)  # written last: a part counts once its JSON is there


def load_part(folder: Path, gid: str) -> tuple[list[Checkpoint], set[str], set[str]]:
    """A part's checkpoints, the device types and the kernel sets that trained them."""
    records = json.loads((folder / f"{gid}.json").read_text())
    params = load_file(str(folder / f"{gid}.safetensors"))["params"]
    if len(params) != len(records):
        raise ZooDamagedError(folder / f"{gid}.safetensors", f"holds {len(params)} rows for {len(records)} records")
    checkpoints = [Checkpoint(Run(**r["run"]), r["epoch"], r["is_best"], params[i], r["metrics"], r["diverged"])
                   for i, r in enumerate(records)]
    # Parts written before kernel sets were recorded say "unknown" rather than nothing.
    return checkpoints, {r.get("device", "cpu") for r in records}, {r.get("kernels") or "unknown" for r in records}


def trained_runs(folders: list[Path]) -> dict[str, Path]:
    """Run id -> the part file (JSON) that holds it, over every part in `folders`; a run in two parts is refused."""
    found: dict[str, Path] = {}
    for folder in folders:
        for path in sorted(folder.glob("*.json")):
            for run_id in dict.fromkeys(r["run"]["run_id"] for r in json.loads(path.read_text())):
                if run_id in found:
                    raise ZooDamagedError(path, f"run {run_id} is present twice (also in {found[run_id]})")
                found[run_id] = path
    return found


def stream_seeds_config(run: Run) -> dict[str, int]:
    """What a built run's `run_config` records: the seeds of its data and dropout streams (the `seed` column holds
    the initialisation's)."""
    seeds = run.stream_seeds()
    return {"data_seed": seeds["data"], "dropout_seed": seeds["dropout"]}


def assemble(build: Build, part_dirs: list[Path]) -> dict[str, Any]:
    """Join the parts into the zoo; every run of the plan must be present exactly once."""
    plan, out = build.plan, build.out
    found = trained_runs(part_dirs)
    expected = [r.run_id for r in build.runs]
    missing = [r for r in expected if r not in found]
    extra = sorted(set(found) - set(expected))
    if missing or extra:
        raise ZooDamagedError(out / plan.config, f"cannot assemble: {len(missing)} runs missing (first: "
                                                f"{missing[:2]}), {len(extra)} not in the plan ({extra[:2]})")
    checkpoints: list[Checkpoint] = []
    devices: set[str] = set()
    kernels: set[str] = set()
    for path in sorted(set(found.values())):
        part, used, computed_by = load_part(path.parent, path.stem)
        checkpoints += part
        devices |= used
        kernels |= computed_by
    checkpoints.sort(key=lambda c: (c.run.run_id, c.is_best, c.epoch))
    task = {"name": plan.task, "source": build.data.source, "description": build.request.task.description}
    with ZooWriter(out, plan.config, build.spec, task=task,
                   provenance={"build_plan": plan.to_dict(), "devices": sorted(devices),
                               "kernels": sorted(kernels), "seed_policy": plan.seed_policy,
                               "shared_seed": plan.shared_seed, "recipe_version": plan.recipe_version},
                   grid={"preset": plan.preset, "runs": plan.runs}, checkpoint_epochs=[*plan.checkpoint_epochs, "best"],
                   shard_size=build.request.preset.shard_size, split_by=plan.split_by, overwrite=True) as writer:
        if build.data.embedding is not None:
            writer.add_extra("embedding", {"table": build.data.embedding})
        for c in checkpoints:
            writer.add(c.params, {"run_id": c.run.run_id, "epoch": c.epoch, "is_best": c.is_best,
                                  "diverged": c.diverged, **c.run.hyperparameters(), **c.metrics,
                                  "run_config": json.dumps(stream_seeds_config(c.run), sort_keys=True)})
        return writer.close()
