"""`stz build`: plan a zoo, train its run groups (resumably, in shards if asked), and write it in the zoo format.

Each finished group of runs is saved as a part (`<out>/<config>/.build/parts/<group>.safetensors` + `.json`,
written under a temporary name and renamed). A killed build run again skips the parts it has; when every group
is there the parts are assembled, in run-id order, into the zoo, so an interrupted build ends with exactly the
zoo an uninterrupted one writes.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import load_file, save

from small_transformer_zoo.format.architecture import ArchitectureSpec
from small_transformer_zoo.devices import kernel_set, resolve_device, usable_cores
from small_transformer_zoo.errors import ZooFormatError
from small_transformer_zoo.store.files import (atomic_write_bytes, atomic_write_json, check_real_folders,
                                               exclusive_lock)
from small_transformer_zoo.format.manifest import MANIFEST_NAME, load_manifest
from small_transformer_zoo.store.writer import ZooWriter

from .data import TaskData
from .device import check_precision, choose_group_size
from small_transformer_zoo.format.splits import SPLIT_UNITS

from .grid import (OPTIMIZERS, PRESETS, SEED_POLICIES, Preset, Run, checkpoint_epochs, group_id, groups, preset_runs,
                   shard_runs)
from .tasks import DataRequest, Task, get_task
from .trainer import Checkpoint, Recipe, train_groups

PLAN_NAME = "plan.json"
CPU_GFLOPS_PER_CORE = 17.7   # the build's measured rate on this project's CPUs (BENCHMARKS.md), for estimates
GPU_TFLOPS = 10.0            # an assumed rate for estimates on an accelerator (not measured here)
CONFIRM_HOURS = 4.0          # a build estimated to take longer asks for --yes or --max-hours


@dataclass(frozen=True)
class BuildPlan:
    """What a build makes; two builds (or shards) with equal plans make the same zoo."""

    task: str
    preset: str
    config: str
    epochs: int
    checkpoint_epochs: list[int]
    batch_size: int
    augment: bool
    precision: str
    runs: int
    architecture: dict[str, Any]
    data_sha256: str
    seed_policy: str = "per-run"
    split_by: str = "run"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def recipe(self) -> Recipe:
        return Recipe(self.epochs, tuple(self.checkpoint_epochs), self.batch_size, self.augment, self.precision)


def config_name(task: str, preset: str, seed_policy: str = "per-run", split_by: str = "run") -> str:
    """`<task>-<preset>` (`<task>` for the paper's), marked when its seeding or split rule is not the default."""
    name = task if preset == "paper" else f"{task}-{preset}"
    return name + ("-shared-seed" if seed_policy == "shared" else "") + ("-family-split" if split_by == "family" else "")


@dataclass(frozen=True)
class BuildRequest:
    """Everything one `stz build` is asked: the task (a registered task), the preset, where the zoo goes, the data,
    and where and how to train (placement choices never change the zoo); `carve_from_test`: a folder without
    training files may have its test files carved into train and test, on purpose and said everywhere; a build
    estimated to take longer than `CONFIRM_HOURS` needs `confirm` or a `max_hours` it fits in."""

    task: Task
    preset: Preset
    out: Path
    data_dir: str | Path | None = None
    word2vec: str | Path | None = None
    device: str = "auto"
    precision: str = "fp32"
    group_size: int | str = "auto"
    workers: int | None = None
    num_shards: int = 1
    shard_index: int = 0
    carve_from_test: bool = False
    confirm: bool = False
    max_hours: float | None = None
    seed_policy: str = "per-run"
    split_by: str = "run"

    def __post_init__(self) -> None:
        if self.seed_policy not in SEED_POLICIES:
            raise ValueError(f"unknown seed policy {self.seed_policy!r}; choose from {list(SEED_POLICIES)}")
        if self.split_by not in SPLIT_UNITS:
            raise ValueError(f"unknown split unit {self.split_by!r}; choose from {list(SPLIT_UNITS)}")

    @classmethod
    def of(cls, task: str, preset: str, out: str | Path, **options: Any) -> "BuildRequest":
        """A request naming the task and preset (checked against their registries)."""
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; presets are {list(PRESETS)}")
        return cls(get_task(task), PRESETS[preset], Path(out), **options)

    @property
    def config(self) -> str:
        return config_name(self.task.name, self.preset.name, self.seed_policy, self.split_by)


@dataclass
class Build:
    """A request resolved before any training: its data, architecture, plan, the runs of this shard and where
    they train."""

    request: BuildRequest
    data: TaskData
    spec: ArchitectureSpec
    plan: BuildPlan
    runs: list[Run]
    mine: list[Run]
    placement: Placement | None = None

    @property
    def out(self) -> Path:
        return self.request.out


def load_task_data(task: Task, data_dir: str | Path | None, preset: Preset, word2vec: str | Path | None = None,
                   carve_from_test: bool = False) -> TaskData:
    """The data a registered task trains on (`builders.tasks`), capped by the preset; errors before any training
    when files are missing or malformed. `word2vec`: a pretrained word2vec text file for a text task's embedding
    instead of the one built from the corpus."""
    if word2vec is not None and "word2vec" not in task.options:
        raise ValueError(f"--word2vec is for text tasks, not {task.name!r}")
    options = {"word2vec": word2vec} if word2vec is not None else {}
    data = task.load(DataRequest(data_dir, preset.max_train_samples, options, carve_from_test))
    if preset.max_train_samples is not None and len(data.train_y) > preset.max_train_samples:
        data.train_x, data.train_y = data.train_x[: preset.max_train_samples], data.train_y[: preset.max_train_samples]
        data.source["train_samples_capped_at"] = preset.max_train_samples
    cap = preset.max_validation_samples
    if cap is not None and len(data.validation_y) > cap:
        data.validation_x, data.validation_y = data.validation_x[:cap], data.validation_y[:cap]
        data.source["validation_samples_capped_at"] = cap
    return data


def make_plan(task: Task, preset: Preset, data: TaskData, spec: ArchitectureSpec, precision: str = "fp32",
              seed_policy: str = "per-run", split_by: str = "run") -> tuple[BuildPlan, list[Run]]:
    """The plan and its runs in run-id order. How runs are grouped is not part of the plan: each run trains the
    same whatever its group, so any group size, device count or shard split builds the same zoo."""
    runs = sorted(preset_runs(task.name, preset, seed_policy), key=lambda r: r.run_id)
    plan = BuildPlan(task.name, preset.name, config_name(task.name, preset.name, seed_policy, split_by),
                     preset.epochs, checkpoint_epochs(preset.epochs, preset.every_epoch), preset.batch_size,
                     preset.augment, precision, len(runs), spec.to_dict(), data.source.get("sha256", ""),
                     seed_policy, split_by)
    return plan, runs


def resolve(request: BuildRequest) -> Build:
    """Load the data and make the plan (errors before any training)."""
    data = load_task_data(request.task, request.data_dir, request.preset, request.word2vec, request.carve_from_test)
    spec = request.task.spec(data)
    plan, runs = make_plan(request.task, request.preset, data, spec, request.precision, request.seed_policy,
                           request.split_by)
    return Build(request, data, spec, plan, runs, shard_runs(runs, request.num_shards, request.shard_index))


def training_flops_per_sample(spec: ArchitectureSpec) -> float:
    """Forward FLOPs of one sample times 3 (forward + backward)."""
    t, d, h, dk, a = spec.num_tokens, spec.d_model, spec.num_heads, spec.d_head, spec.d_mlp
    embed = 2 * t * spec.in_channels * spec.patch_size ** 2 * d if spec.modality == "vision" else 0
    block = 2 * t * d * 3 * h * dk + 2 * 2 * h * t * t * dk + 2 * t * h * dk * d + 2 * 2 * t * d * a
    head = 2 * (d * d + d * spec.num_classes)
    return 3.0 * (embed + spec.num_blocks * block + head)


def estimate_cost(plan: BuildPlan, data: TaskData, spec: ArchitectureSpec, runs: list[Run]) -> dict[str, float]:
    """Model-epochs and training FLOPs of a plan, with the evaluation's forward passes: validation every epoch, test
    at the checkpoint epochs and at the best epoch (counted once more, as when it is not a checkpoint epoch)."""
    samples = sum(round(r.train_fraction * len(data.train_y)) for r in runs) * plan.epochs
    tested = len(plan.checkpoint_epochs) + 1
    eval_samples = len(runs) * (plan.epochs * len(data.validation_y) + tested * len(data.test_y))
    flops = samples * training_flops_per_sample(spec) + eval_samples * training_flops_per_sample(spec) / 3
    return {"runs": len(runs), "model_epochs": len(runs) * plan.epochs, "train_samples": samples,
            "tflop": flops / 1e12}


def _build_dir(out: Path, config: str) -> Path:
    return out / config / ".build"


def check_output(out: Path, plan: BuildPlan) -> bool:
    """True if the zoo is already built with this plan; errors if the folder holds another zoo or build."""
    config_dir = out / plan.config
    if (config_dir / MANIFEST_NAME).is_file():
        manifest = load_manifest(config_dir)
        if manifest["architecture"] != plan.architecture:
            raise ZooFormatError(config_dir / MANIFEST_NAME, "holds a zoo of another architecture; choose another "
                                                             "--out or remove it")
        if manifest.get("provenance", {}).get("build_plan") == plan.to_dict():
            return True
        raise ZooFormatError(config_dir / MANIFEST_NAME, "holds a zoo built with another plan (task, preset or "
                                                         "data differ); choose another --out or remove it")
    plan_path = _build_dir(out, plan.config) / PLAN_NAME
    if plan_path.is_file():
        previous = json.loads(plan_path.read_text())
        if previous != plan.to_dict():
            raise ZooFormatError(plan_path, "an unfinished build with another plan is here; choose another --out or "
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
        raise ZooFormatError(folder / f"{gid}.safetensors", f"holds {len(params)} rows for {len(records)} records")
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
                    raise ZooFormatError(path, f"run {run_id} is present twice (also in {found[run_id]})")
                found[run_id] = path
    return found


def assemble(build: Build, part_dirs: list[Path]) -> dict[str, Any]:
    """Join the parts into the zoo; every run of the plan must be present exactly once."""
    plan, out = build.plan, build.out
    found = trained_runs(part_dirs)
    expected = [r.run_id for r in build.runs]
    missing = [r for r in expected if r not in found]
    extra = sorted(set(found) - set(expected))
    if missing or extra:
        raise ZooFormatError(out / plan.config, f"cannot assemble: {len(missing)} runs missing (first: "
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
                               "kernels": sorted(kernels), "seed_policy": plan.seed_policy},
                   grid={"preset": plan.preset, "runs": plan.runs}, checkpoint_epochs=[*plan.checkpoint_epochs, "best"],
                   shard_size=build.request.preset.shard_size, split_by=plan.split_by, overwrite=True) as writer:
        if build.data.embedding is not None:
            writer.add_extra("embedding", {"table": build.data.embedding})
        for c in checkpoints:
            writer.add(c.params, {"run_id": c.run.run_id, "epoch": c.epoch, "is_best": c.is_best,
                                  "diverged": c.diverged, **{k: v for k, v in c.run.hyperparameters().items()},
                                  **c.metrics})
        return writer.close()


@dataclass(frozen=True)
class Placement:
    """Where and how a build trains: device, group size and CPU workers (none of it changes the zoo)."""

    device: torch.device
    group_size: int
    workers: int | None = None


def plan_placement(build: Build, free_bytes: int | None = None) -> Placement:
    """Resolve `--device`, check `--precision` there and choose the group size (errors before any training)."""
    request, spec, data = build.request, build.spec, build.data
    where = resolve_device(request.device)
    check_precision(where, build.plan.precision)
    tokens = spec.num_tokens if spec.modality == "vision" else data.train_x.shape[1]
    family = max(sum(r.optimizer == o for r in build.mine) for o in OPTIMIZERS)
    parallel = (request.workers or usable_cores()) if where.type == "cpu" else 1
    size = choose_group_size(request.group_size, where, spec, build.plan.batch_size, build.plan.precision, tokens,
                             request.preset.group_size, family, parallel, free_bytes)
    return Placement(where, size, request.workers)


def estimated_hours(cost: dict[str, float], placement: Placement) -> float:
    """A build's hours at this project's measured CPU rate per core, or an assumed accelerator rate."""
    if placement.device.type == "cpu":
        rate = CPU_GFLOPS_PER_CORE * 1e9 * (placement.workers or usable_cores())
    else:
        rate = GPU_TFLOPS * 1e12
    return cost["tflop"] * 1e12 / rate / 3600


def check_duration(request: BuildRequest, hours: float) -> None:
    """A long build runs only when asked for: `confirm` (--yes), or a `max_hours` that the estimate fits in."""
    if request.max_hours is not None:
        if hours > request.max_hours:
            raise ValueError(f"this build is estimated at {hours:,.1f} hours, more than --max-hours "
                             f"{request.max_hours:g}; choose a smaller preset, shard it (--num-shards) or raise it")
        return
    if hours > CONFIRM_HOURS and not request.confirm:
        raise ValueError(f"this build is estimated at {hours:,.1f} hours on this device; pass --yes (or "
                         f"--max-hours H) to start it, or shard it over machines with --num-shards")


def run_build(request: BuildRequest, *, dry_run: bool = False, progress: bool = True,
              executor: Callable[..., Any] | None = None, log: Callable[[str], None] = print,
              free_bytes: int | None = None) -> dict[str, Any]:
    """Build (or dry-run) a zoo; with several shards, this call trains one shard's runs and does not assemble.
    `free_bytes` overrides the device's measured free memory (for `--group-size auto`)."""
    build = resolve(request)
    plan = build.plan
    cost = estimate_cost(plan, build.data, build.spec, build.mine)
    data = build.data
    log(f"plan: task {plan.task}, preset {plan.preset}, config {plan.config}: {plan.runs} runs ({plan.seed_policy} "
        f"seeds, split by {plan.split_by}), {plan.epochs} epochs "
        f"of batches of {plan.batch_size}{'' if plan.augment else ', no augmentation'}, {plan.precision}, checkpoints "
        f"at epochs {_epoch_list(plan.checkpoint_epochs)} and the best; data: {data.source.get('from')} "
        f"({len(data.train_y)} train, {len(data.validation_y)} validation, {len(data.test_y)} test)")
    if data.source.get("carved_from_test"):
        log(f"note: {data.source['files']}: the zoo's runs train on samples of the data set's test half "
            f"(--carve-from-test); its manifest and card say so")
    build.placement = plan_placement(build, free_bytes)
    hours = estimated_hours(cost, build.placement)
    log(f"this {'shard' if request.num_shards > 1 else 'build'}: {cost['runs']} runs, {cost['model_epochs']:,} "
        f"model-epochs, {cost['tflop']:.2f} TFLOP, about {hours:,.1f} hours on {build.placement.device}")
    if dry_run:
        return {"plan": plan.to_dict(), "cost": {**cost, "estimated_hours": hours},
                "device": str(build.placement.device), "group_size": build.placement.group_size}
    check_duration(request, hours)
    with exclusive_lock(request.out, plan.config, f"stz build --preset {plan.preset}"):
        return _train_and_assemble(build, executor, progress, log)


def _train_and_assemble(build: Build, executor: Callable[..., Any] | None, progress: bool,
                        log: Callable[[str], None]) -> dict[str, Any]:
    """The part of a build that writes (under the output's lock): train what no part holds yet, then assemble."""
    out, plan, request = build.out, build.plan, build.request
    if check_output(out, plan):
        log(f"{out / plan.config} is already built with this plan; reusing it")
        shutil.rmtree(_build_dir(out, plan.config), ignore_errors=True)  # a run killed after the zoo was in place
        return load_manifest(out / plan.config)
    parts = _build_dir(out, plan.config) / "parts"
    check_real_folders(out, parts.relative_to(out))
    parts.mkdir(parents=True, exist_ok=True)
    atomic_write_json(_build_dir(out, plan.config) / PLAN_NAME, plan.to_dict())
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
    shutil.rmtree(_build_dir(out, plan.config), ignore_errors=True)
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
        total_steps = sum(recipe.epochs * math.ceil(max(round(r.train_fraction * len(data.train_y)) for r in g)
                                                    / recipe.batch_size) for g in todo)
        with tqdm(total=total_steps, desc="training", unit="step", disable=not progress, file=sys.stderr) as bar:
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
        raise ZooFormatError(existing, "a zoo is already here; merging would replace it: pass --replace to do so, "
                                       "or merge into another folder")
    part_dirs = []
    for folder in map(Path, shard_dirs):
        plan_path = _build_dir(folder, plan.config) / PLAN_NAME
        if not plan_path.is_file():
            raise ZooFormatError(plan_path, "no build plan here: not a shard output of this config")
        if json.loads(plan_path.read_text()) != plan.to_dict():
            raise ZooFormatError(plan_path, "this shard was built with another plan")
        part_dirs.append(_build_dir(folder, plan.config) / "parts")
    with exclusive_lock(request.out, plan.config, f"stz merge --preset {plan.preset}"):
        return assemble(build, part_dirs)
