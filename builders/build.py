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
from small_transformer_zoo.devices import resolve_device, usable_cores
from small_transformer_zoo.errors import ZooFormatError
from small_transformer_zoo.store.files import atomic_write_bytes, atomic_write_json, exclusive_lock
from small_transformer_zoo.format.manifest import MANIFEST_NAME, load_manifest
from small_transformer_zoo.store.writer import ZooWriter

from .data import TaskData
from .device import check_precision, choose_group_size
from .grid import OPTIMIZERS, PRESETS, Preset, Run, checkpoint_epochs, group_id, groups, preset_runs, shard_runs
from .tasks import DataRequest, get_task
from .trainer import Checkpoint, train_groups

PLAN_NAME = "plan.json"


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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def config_name(task: str, preset: str) -> str:
    return task if preset == "paper" else f"{task}-{preset}"


def load_task_data(task: str, data_dir: str | Path | None, preset: Preset,
                   word2vec: str | Path | None = None) -> TaskData:
    """The data a registered task trains on (`builders.tasks`), capped by the preset; errors before any training
    when files are missing or malformed. `word2vec`: a pretrained word2vec text file for a text task's embedding
    instead of the one built from the corpus."""
    found = get_task(task)
    if word2vec is not None and "word2vec" not in found.options:
        raise ValueError(f"--word2vec is for text tasks, not {task!r}")
    options = {"word2vec": word2vec} if word2vec is not None else {}
    data = found.load(DataRequest(data_dir, preset.max_train_samples, options))
    if preset.max_train_samples is not None and len(data.train_y) > preset.max_train_samples:
        data.train_x, data.train_y = data.train_x[: preset.max_train_samples], data.train_y[: preset.max_train_samples]
        data.source["train_samples_capped_at"] = preset.max_train_samples
    cap = preset.max_validation_samples
    if cap is not None and len(data.validation_y) > cap:
        data.validation_x, data.validation_y = data.validation_x[:cap], data.validation_y[:cap]
        data.source["validation_samples_capped_at"] = cap
    return data


def spec_for(task: str, data: TaskData) -> ArchitectureSpec:
    return get_task(task).spec(data)


def make_plan(task: str, preset: Preset, data: TaskData, spec: ArchitectureSpec,
              precision: str = "fp32") -> tuple[BuildPlan, list[Run]]:
    """The plan and its runs in run-id order. How runs are grouped is not part of the plan: each run trains the
    same whatever its group, so any group size, device count or shard split builds the same zoo."""
    runs = sorted(preset_runs(task, preset), key=lambda r: r.run_id)
    plan = BuildPlan(task, preset.name, config_name(task, preset.name), preset.epochs,
                     checkpoint_epochs(preset.epochs, preset.every_epoch), preset.batch_size, preset.augment, precision,
                     len(runs), spec.to_dict(), data.source.get("sha256", ""))
    return plan, runs


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


def save_part(folder: Path, gid: str, checkpoints: list[Checkpoint], device: str = "cpu") -> None:
    records = [{"run": asdict(c.run), "epoch": c.epoch, "is_best": c.is_best, "metrics": c.metrics,
                "diverged": c.diverged, "device": device} for c in checkpoints]
    params = np.stack([c.params for c in checkpoints]).astype(np.float32)
    atomic_write_bytes(folder / f"{gid}.safetensors", save({"params": params}))
    atomic_write_json(folder / f"{gid}.json", records)  # written last: a part counts once its JSON is there


def load_part(folder: Path, gid: str) -> tuple[list[Checkpoint], set[str]]:
    """A part's checkpoints and the devices that trained them."""
    records = json.loads((folder / f"{gid}.json").read_text())
    params = load_file(str(folder / f"{gid}.safetensors"))["params"]
    if len(params) != len(records):
        raise ZooFormatError(folder / f"{gid}.safetensors", f"holds {len(params)} rows for {len(records)} records")
    checkpoints = [Checkpoint(Run(**r["run"]), r["epoch"], r["is_best"], params[i], r["metrics"], r["diverged"])
                   for i, r in enumerate(records)]
    return checkpoints, {r.get("device", "cpu") for r in records}


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


def assemble(out: Path, plan: BuildPlan, runs: list[Run], part_dirs: list[Path], spec: ArchitectureSpec,
             data: TaskData, shard_size: int) -> dict[str, Any]:
    """Join the parts into the zoo; every run of the plan must be present exactly once."""
    found = trained_runs(part_dirs)
    expected = [r.run_id for r in runs]
    missing = [r for r in expected if r not in found]
    extra = sorted(set(found) - set(expected))
    if missing or extra:
        raise ZooFormatError(out / plan.config, f"cannot assemble: {len(missing)} runs missing (first: "
                                                f"{missing[:2]}), {len(extra)} not in the plan ({extra[:2]})")
    checkpoints: list[Checkpoint] = []
    devices: set[str] = set()
    for path in sorted(set(found.values())):
        part, used = load_part(path.parent, path.stem)
        checkpoints += part
        devices |= used
    checkpoints.sort(key=lambda c: (c.run.run_id, c.is_best, c.epoch))
    task = {"name": plan.task, "source": data.source, "description": get_task(plan.task).description}
    with ZooWriter(out, plan.config, spec, task=task,
                   provenance={"build_plan": plan.to_dict(), "devices": sorted(devices)},
                   grid={"preset": plan.preset, "runs": plan.runs}, checkpoint_epochs=[*plan.checkpoint_epochs, "best"],
                   shard_size=shard_size, overwrite=True) as writer:
        if data.embedding is not None:
            writer.add_extra("embedding", {"table": data.embedding})
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


def plan_placement(device: str, group_size: int | str, workers: int | None, preset: Preset, plan: BuildPlan,
                   spec: ArchitectureSpec, data: TaskData, runs: list[Run], free_bytes: int | None = None) -> Placement:
    """Resolve `--device`, check `--precision` there and choose the group size (errors before any training)."""
    where = resolve_device(device)
    check_precision(where, plan.precision)
    tokens = spec.num_tokens if spec.modality == "vision" else data.train_x.shape[1]
    family = max(sum(r.optimizer == o for r in runs) for o in OPTIMIZERS)
    parallel = (workers or usable_cores()) if where.type == "cpu" else 1
    size = choose_group_size(group_size, where, spec, plan.batch_size, plan.precision, tokens, preset.group_size,
                             family, parallel, free_bytes)
    return Placement(where, size, workers)


def run_build(task: str, preset_name: str, out: str | Path, data_dir: str | Path | None = None,
              num_shards: int = 1, shard_index: int = 0, dry_run: bool = False, progress: bool = True,
              executor: Callable[..., Any] | None = None, log: Callable[[str], None] = print,
              word2vec: str | Path | None = None, device: str = "cpu", precision: str = "fp32",
              group_size: int | str = "auto", workers: int | None = None,
              free_bytes: int | None = None) -> dict[str, Any]:
    """Build (or dry-run) a zoo; with several shards, this call trains one shard's runs and does not assemble.

    `device`: auto, cpu, cuda or cuda:N; `precision`: fp32 or bf16 (autocast matmuls, float32 weights and
    checkpoints); `group_size`: runs trained together, `auto` to fit the device's free memory (`free_bytes`
    overrides the measured figure). None of these placement choices changes which runs or checkpoints the zoo has.
    """
    if preset_name not in PRESETS:
        raise ValueError(f"unknown preset {preset_name!r}; presets are {list(PRESETS)}")
    preset, out = PRESETS[preset_name], Path(out)
    data = load_task_data(task, data_dir, preset, word2vec)
    spec = spec_for(task, data)
    plan, runs = make_plan(task, preset, data, spec, precision)
    mine = shard_runs(runs, num_shards, shard_index)
    cost = estimate_cost(plan, data, spec, mine)
    log(f"plan: task {task}, preset {preset_name}, config {plan.config}: {plan.runs} runs, {plan.epochs} epochs of "
        f"batches of {plan.batch_size}{'' if plan.augment else ', no augmentation'}, {plan.precision}, checkpoints "
        f"at epochs {_epoch_list(plan.checkpoint_epochs)} and the best; data: {data.source.get('from')} "
        f"({len(data.train_y)} train, {len(data.validation_y)} validation, {len(data.test_y)} test)")
    log(f"this {'shard' if num_shards > 1 else 'build'}: {cost['runs']} runs, {cost['model_epochs']:,} model-epochs, "
        f"{cost['tflop']:.2f} TFLOP")
    placement = plan_placement(device, group_size, workers, preset, plan, spec, data, mine, free_bytes)
    if dry_run:
        return {"plan": plan.to_dict(), "cost": cost, "device": str(placement.device),
                "group_size": placement.group_size}
    with exclusive_lock(out, plan.config, f"stz build --preset {preset_name}"):
        return _train_and_assemble(out, plan, runs, mine, data, spec, preset, placement, executor, progress, log,
                                   num_shards, shard_index)


def _train_and_assemble(out: Path, plan: BuildPlan, runs: list[Run], mine: list[Run], data: TaskData,
                        spec: ArchitectureSpec, preset: Preset, placement: Placement,
                        executor: Callable[..., Any] | None, progress: bool, log: Callable[[str], None],
                        num_shards: int, shard_index: int) -> dict[str, Any]:
    """The part of a build that writes (under the output's lock): train what no part holds yet, then assemble."""
    if check_output(out, plan):
        log(f"{out / plan.config} is already built with this plan; reusing it")
        shutil.rmtree(_build_dir(out, plan.config), ignore_errors=True)  # a run killed after the zoo was in place
        return load_manifest(out / plan.config)
    parts = _build_dir(out, plan.config) / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    atomic_write_json(_build_dir(out, plan.config) / PLAN_NAME, plan.to_dict())
    done = trained_runs([parts])
    todo = groups([r for r in mine if r.run_id not in done], placement.group_size)
    if done:
        log(f"resuming: {sum(r.run_id in done for r in mine)} of {len(mine)} runs already trained")
    log(f"training on {placement.device}: {len(todo)} groups of up to {placement.group_size} runs")
    train = executor or local_executor()
    train(todo, data, spec, plan, parts, progress, placement)
    if num_shards > 1:
        log(f"shard {shard_index} of {num_shards} done; join the shards with `stz merge`")
        return {"plan": plan.to_dict(), "parts": str(parts)}
    manifest = assemble(out, plan, runs, [parts], spec, data, preset.shard_size)
    shutil.rmtree(_build_dir(out, plan.config), ignore_errors=True)
    log(f"wrote {manifest['counts']['checkpoints']:,} checkpoints of {manifest['counts']['runs']:,} runs to "
        f"{out / plan.config}")
    return manifest


def _epoch_list(epochs: list[int]) -> str:
    consecutive = len(epochs) > 3 and epochs == list(range(epochs[0], epochs[-1] + 1))
    return f"{epochs[0]}..{epochs[-1]}" if consecutive else str(epochs)


def local_executor() -> Callable[..., None]:
    """Train the groups on this machine (CPU workers or one accelerator), saving each as it finishes."""
    def execute(todo: list[list[Run]], data: TaskData, spec: ArchitectureSpec, plan: BuildPlan, parts: Path,
                progress: bool, placement: Placement) -> None:
        from tqdm import tqdm

        total_steps = sum(plan.epochs * math.ceil(max(round(r.train_fraction * len(data.train_y)) for r in g)
                                                  / plan.batch_size) for g in todo)
        with tqdm(total=total_steps, desc="training", unit="step", disable=not progress, file=sys.stderr) as bar:
            finished = train_groups(todo, data, spec, plan.epochs, plan.checkpoint_epochs, plan.batch_size,
                                    placement.workers, lambda: bar.update(1), placement.device, plan.precision,
                                    plan.augment)
            for index, (group, checkpoints, seconds) in enumerate(finished, start=1):
                save_part(parts, group_id(group), checkpoints, placement.device.type)
                bar.write(f"group {index}/{len(todo)} {group_id(group)} ({group[0].optimizer}, {len(group)} runs): "
                          f"{seconds:.1f} s")

    return execute


def merge_shards(out: str | Path, shard_dirs: list[str | Path], task: str, preset_name: str,
                 data_dir: str | Path | None = None, word2vec: str | Path | None = None,
                 precision: str = "fp32") -> dict[str, Any]:
    """Join the parts of sharded builds (`--num-shards`) into one zoo under `out`."""
    preset, out = PRESETS[preset_name], Path(out)
    data = load_task_data(task, data_dir, preset, word2vec)
    spec = spec_for(task, data)
    plan, runs = make_plan(task, preset, data, spec, precision)
    part_dirs = []
    for folder in map(Path, shard_dirs):
        plan_path = _build_dir(folder, plan.config) / PLAN_NAME
        if not plan_path.is_file():
            raise ZooFormatError(plan_path, "no build plan here: not a shard output of this config")
        if json.loads(plan_path.read_text()) != plan.to_dict():
            raise ZooFormatError(plan_path, "this shard was built with another plan")
        part_dirs.append(_build_dir(folder, plan.config) / "parts")
    with exclusive_lock(out, plan.config, f"stz merge --preset {preset_name}"):
        return assemble(out, plan, runs, part_dirs, spec, data, preset.shard_size)
