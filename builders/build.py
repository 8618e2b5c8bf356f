"""`stz build`: plan a zoo, train its run groups (resumably, in shards if asked), and write it in the zoo format.

The jobs are in their own modules: the request and its resolution (`request`), the plan and its cost (`plan`),
where it trains (`placement`), and the parts on disk with their assembly (`parts`). This module runs them: train
what no part holds yet, then assemble; `merge_shards` joins the parts of sharded builds.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from small_transformer_zoo.devices import kernel_set
from small_transformer_zoo.errors import ZooArgumentError, ZooNotFoundError
from small_transformer_zoo.format.manifest import MANIFEST_NAME, load_manifest
from small_transformer_zoo.store.files import atomic_write_json, check_real_folders, exclusive_lock
from small_transformer_zoo.store.local_index import register_local_zoo

from .grid import Run, group_id, groups
from .parts import PLAN_NAME, assemble, build_dir, check_output, save_part, trained_runs
from .placement import plan_placement
from .plan import check_duration, duration_text, estimate_cost, estimated_hours
from .request import Build, BuildRequest, resolve
from .trainer import steps_per_epoch, train_groups


def run_build(request: BuildRequest, *, dry_run: bool = False, progress: bool = True,
              executor: Callable[..., Any] | None = None, log: Callable[[str], None] = print,
              free_bytes: int | None = None) -> dict[str, Any]:
    """Build (or dry-run) a zoo; with several shards, this call trains one shard's runs and does not assemble.
    `free_bytes` overrides the device's measured free memory (for `--group-size auto`)."""
    build = resolve(request)
    plan = build.plan
    cost = estimate_cost(plan, build.data, build.spec, build.mine)
    data = build.data
    seeding = "per-run seeds" if plan.shared_seed is None else f"{plan.seed_policy}, seed {plan.shared_seed}"
    log(f"plan: task {plan.task}, preset {plan.preset}, config {plan.config}: {plan.runs} runs ({seeding}, "
        f"split by {plan.split_by}), recipe version {plan.recipe_version}, {plan.epochs} epochs "
        f"of batches of {plan.batch_size}{'' if plan.augment else ', no augmentation'}, {plan.precision}, checkpoints "
        f"at epochs {_epoch_list(plan.checkpoint_epochs)} and the best; data: {data.source.get('from')} "
        f"({len(data.train_y)} train, {len(data.validation_y)} validation, {len(data.test_y)} test)")
    if data.source.get("carved_from_test"):
        log(f"note: {data.source['files']}; the manifest and card say so")
    build.placement = plan_placement(build, free_bytes)
    hours = estimated_hours(cost, build.placement)
    log(f"this {'shard' if request.num_shards > 1 else 'build'}: {cost['runs']} runs, {cost['model_epochs']:,} "
        f"model-epochs, {cost['tflop']:.2f} TFLOP, {duration_text(hours)} on {build.placement.device}")
    if dry_run:
        return {"plan": plan.to_dict(), "cost": {**cost, "estimated_hours": hours},
                "device": str(build.placement.device), "group_size": build.placement.group_size}
    check_duration(hours, request.confirm, request.max_hours)
    with exclusive_lock(request.out, plan.config, f"stz build --preset {plan.preset}"):
        return _train_and_assemble(build, executor, progress, log)


def _train_and_assemble(build: Build, executor: Callable[..., Any] | None, progress: bool,
                        log: Callable[[str], None]) -> dict[str, Any]:
    """The part of a build that writes (under the output's lock): train what no part holds yet, then assemble."""
    out, plan, request = build.out, build.plan, build.request
    if check_output(out, plan):
        log(f"{out / plan.config} is already built with this plan; reusing it")
        shutil.rmtree(build_dir(out, plan.config), ignore_errors=True)  # a run killed after the zoo was in place
        register_local_zoo(plan.config, out)
        return load_manifest(out / plan.config)
    parts = build_dir(out, plan.config) / "parts"
    check_real_folders(out, parts.relative_to(out))
    parts.mkdir(parents=True, exist_ok=True)
    atomic_write_json(build_dir(out, plan.config) / PLAN_NAME, plan.to_dict())
    done = trained_runs([parts])
    todo = groups([r for r in build.mine if r.run_id not in done], build.placement.group_size)
    if done:
        log(f"resuming: {sum(r.run_id in done for r in build.mine)} of {len(build.mine)} runs already trained")
    log(f"training on {build.placement.device}: {len(todo)} groups of up to {build.placement.group_size} runs")
    (executor or local_executor())(todo, build, parts, progress)
    if request.num_shards > 1:
        log(f"shard {request.shard_index} of {request.num_shards} done; join the shards with `stz merge`")
        return {"plan": plan.to_dict(), "parts": str(parts)}
    manifest = assemble(build, [parts])
    shutil.rmtree(build_dir(out, plan.config), ignore_errors=True)
    log(f"wrote {manifest['counts']['checkpoints']:,} checkpoints of {manifest['counts']['runs']:,} runs to "
        f"{out / plan.config}; load_dataset('small-transformer-zoo', '{plan.config}') now reads it")
    return manifest


def _epoch_list(epochs: list[int]) -> str:
    consecutive = len(epochs) > 3 and epochs == list(range(epochs[0], epochs[-1] + 1))
    return f"{epochs[0]}..{epochs[-1]}" if consecutive else str(epochs)


def local_executor() -> Callable[..., None]:
    """Train the groups on this machine (CPU workers or one accelerator), saving each as it finishes."""
    def execute(todo: list[list[Run]], build: Build, parts: Path, progress: bool) -> None:
        from tqdm import tqdm

        placement, recipe, data = build.placement, build.plan.recipe(), build.data
        total_steps = sum(recipe.epochs * steps_per_epoch(max(round(r.train_fraction * len(data.train_y)) for r in g),
                                                          recipe.batch_size) for g in todo)
        bars = progress and sys.stderr.isatty()  # a log gets the group lines only, never a bar redrawn
        with tqdm(total=total_steps, desc="training", unit="step", disable=not bars, file=sys.stderr) as bar:
            finished = train_groups(todo, data, build.spec, recipe, placement.device, placement.workers,
                                    lambda: bar.update(1))
            for index, (group, checkpoints, seconds) in enumerate(finished, start=1):
                save_part(parts, group_id(group), checkpoints, placement.device.type, kernel_set(placement.device))
                bar.write(f"group {index}/{len(todo)} {group_id(group)} ({group[0].optimizer}, {len(group)} runs): "
                          f"{seconds:.1f} s")

    return execute


def merge_shards(request: BuildRequest, shard_dirs: list[str | Path], replace: bool = False) -> dict[str, Any]:
    """Join the parts of sharded builds (`--num-shards`) into the zoo at `request.out`; refuses to replace a zoo
    already there unless `replace`."""
    build = resolve(request)
    plan = build.plan
    existing = request.out / plan.config / MANIFEST_NAME
    if existing.exists() and not replace:
        raise ZooArgumentError(existing, "a zoo is already here; merging would replace it: pass --replace to do so, "
                                       "or merge into another folder")
    part_dirs = []
    for folder in map(Path, shard_dirs):
        plan_path = build_dir(folder, plan.config) / PLAN_NAME
        if not plan_path.is_file():
            raise ZooNotFoundError(plan_path, "no build plan here: not a shard output of this config")
        if json.loads(plan_path.read_text()) != plan.to_dict():
            raise ZooArgumentError(plan_path, "this shard was built with another plan")
        part_dirs.append(build_dir(folder, plan.config) / "parts")
    with exclusive_lock(request.out, plan.config, f"stz merge --preset {plan.preset}"):
        return assemble(build, part_dirs)
