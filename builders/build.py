"""`stz build`: plan a zoo, train its run groups (resumably, in shards if asked), and write it in the zoo format.

Each finished group of runs is saved as a part (`<out>/<config>/.build/parts/<group>.safetensors` + `.json`,
written under a temporary name and renamed). A killed build run again skips the parts it has; when every group
is there the parts are assembled, in run-id order, into the zoo, so an interrupted build ends with exactly the
zoo an uninterrupted one writes.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file, save

from small_transformer_zoo.architecture import ArchitectureSpec, mnist_spec
from small_transformer_zoo.errors import ZooFormatError
from small_transformer_zoo.files import atomic_write_bytes, atomic_write_json
from small_transformer_zoo.manifest import MANIFEST_NAME, load_manifest
from small_transformer_zoo.writer import ZooWriter

from .data import FASHION_MNIST_DIR, TaskData, hub_repo, load_embedded_mnist, load_hub_images, load_idx_folder
from .grid import PRESETS, TASKS, Preset, Run, checkpoint_epochs, group_id, groups, preset_runs, shard_groups
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
    runs: int
    groups: int
    architecture: dict[str, Any]
    data_sha256: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def config_name(task: str, preset: str) -> str:
    return task if preset == "paper" else f"{task}-{preset}"


def load_task_data(task: str, data_dir: str | Path | None, preset: Preset,
                   word2vec: str | Path | None = None) -> TaskData:
    """The data a task trains on; errors before any training when files are missing or malformed.
    `word2vec`: a pretrained word2vec text file for the AG News embedding instead of the one built from the corpus."""
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; tasks are {list(TASKS)}")
    if word2vec is not None and task != "agnews":
        raise ValueError(f"--word2vec is for the text task agnews, not {task!r}")
    repo = hub_repo(data_dir)
    if task == "agnews":
        from .text import load_ag_news

        data = load_ag_news(data_dir, max_train=preset.max_train_samples, word2vec=word2vec)
    elif repo is not None:
        data = load_hub_images(repo, task)
    elif task == "fashion_mnist":
        folder = Path(data_dir) if data_dir else FASHION_MNIST_DIR
        if not folder.is_dir():
            raise ZooFormatError(folder, "no Fashion-MNIST here: `apt-get install dataset-fashion-mnist` installs it "
                                         "there, or pass --data-dir")
        data = load_idx_folder(folder, "fashion_mnist")
    elif data_dir:
        data = load_idx_folder(data_dir, "mnist")
    else:
        data = load_embedded_mnist()
    if preset.max_train_samples is not None and len(data.train_y) > preset.max_train_samples:
        data.train_x, data.train_y = data.train_x[: preset.max_train_samples], data.train_y[: preset.max_train_samples]
        data.source["train_samples_capped_at"] = preset.max_train_samples
    return data


def spec_for(data: TaskData) -> ArchitectureSpec:
    if data.modality == "vision":
        return mnist_spec()
    from small_transformer_zoo.architecture import text_spec

    return text_spec(vocab_size=data.embedding.shape[0], max_length=data.train_x.shape[1], num_classes=data.num_classes)


def make_plan(task: str, preset: Preset, data: TaskData, spec: ArchitectureSpec) -> tuple[BuildPlan, list[list[Run]]]:
    runs = preset_runs(task, preset)
    all_groups = groups(runs, preset.group_size)
    plan = BuildPlan(task, preset.name, config_name(task, preset.name), preset.epochs, checkpoint_epochs(preset.epochs),
                     preset.batch_size, len(runs), len(all_groups), spec.to_dict(), data.source.get("sha256", ""))
    return plan, all_groups


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


def save_part(folder: Path, gid: str, checkpoints: list[Checkpoint]) -> None:
    records = [{"run": asdict(c.run), "epoch": c.epoch, "is_best": c.is_best, "metrics": c.metrics,
                "diverged": c.diverged} for c in checkpoints]
    params = np.stack([c.params for c in checkpoints]).astype(np.float32)
    atomic_write_bytes(folder / f"{gid}.safetensors", save({"params": params}))
    atomic_write_json(folder / f"{gid}.json", records)  # written last: a part counts once its JSON is there


def load_part(folder: Path, gid: str) -> list[Checkpoint]:
    records = json.loads((folder / f"{gid}.json").read_text())
    params = load_file(str(folder / f"{gid}.safetensors"))["params"]
    if len(params) != len(records):
        raise ZooFormatError(folder / f"{gid}.safetensors", f"holds {len(params)} rows for {len(records)} records")
    return [Checkpoint(Run(**r["run"]), r["epoch"], r["is_best"], params[i], r["metrics"], r["diverged"])
            for i, r in enumerate(records)]


def assemble(out: Path, plan: BuildPlan, all_groups: list[list[Run]], part_dirs: list[Path], spec: ArchitectureSpec,
             data: TaskData, shard_size: int) -> dict[str, Any]:
    """Join the parts into the zoo; every group must be present exactly once."""
    found: dict[str, Path] = {}
    for folder in part_dirs:
        for path in sorted(folder.glob("*.json")):
            if path.stem in found:
                raise ZooFormatError(path, f"group {path.stem} is present twice (also in {found[path.stem]})")
            found[path.stem] = folder
    expected = [group_id(g) for g in all_groups]
    missing = [g for g in expected if g not in found]
    extra = sorted(set(found) - set(expected))
    if missing or extra:
        raise ZooFormatError(out / plan.config, f"cannot assemble: {len(missing)} groups missing (first: "
                                                f"{missing[:2]}), {len(extra)} not in the plan ({extra[:2]})")
    checkpoints = [c for gid in expected for c in load_part(found[gid], gid)]
    checkpoints.sort(key=lambda c: (c.run.run_id, c.is_best, c.epoch))
    writer = ZooWriter(out, plan.config, spec, task={"name": plan.task, "source": data.source},
                       provenance={"build_plan": plan.to_dict()},
                       grid={"preset": plan.preset, "runs": plan.runs}, checkpoint_epochs=[*plan.checkpoint_epochs, "best"],
                       shard_size=shard_size, overwrite=True)
    if data.embedding is not None:
        writer.add_extra("embedding", {"table": data.embedding})
    for c in checkpoints:
        writer.add(c.params, {"run_id": c.run.run_id, "epoch": c.epoch, "is_best": c.is_best, "diverged": c.diverged,
                              **{k: v for k, v in c.run.hyperparameters().items()}, **c.metrics})
    return writer.close()


def run_build(task: str, preset_name: str, out: str | Path, data_dir: str | Path | None = None,
              num_shards: int = 1, shard_index: int = 0, dry_run: bool = False, progress: bool = True,
              executor: Callable[..., Any] | None = None, log: Callable[[str], None] = print,
              word2vec: str | Path | None = None) -> dict[str, Any]:
    """Build (or dry-run) a zoo; with several shards, this call trains one shard's groups and does not assemble."""
    if preset_name not in PRESETS:
        raise ValueError(f"unknown preset {preset_name!r}; presets are {list(PRESETS)}")
    preset, out = PRESETS[preset_name], Path(out)
    data = load_task_data(task, data_dir, preset, word2vec)
    spec = spec_for(data)
    plan, all_groups = make_plan(task, preset, data, spec)
    mine = shard_groups(all_groups, num_shards, shard_index)
    cost = estimate_cost(plan, data, spec, [r for g in mine for r in g])
    log(f"plan: task {task}, preset {preset_name}, config {plan.config}: {plan.runs} runs in {plan.groups} groups, "
        f"{plan.epochs} epochs of batches of {plan.batch_size}, checkpoints at epochs {plan.checkpoint_epochs} and the "
        f"best; data: "
        f"{data.source.get('from')} ({len(data.train_y)} train, {len(data.validation_y)} validation, "
        f"{len(data.test_y)} test)")
    log(f"this {'shard' if num_shards > 1 else 'build'}: {len(mine)} groups, {cost['runs']} runs, "
        f"{cost['model_epochs']:,} model-epochs, {cost['tflop']:.2f} TFLOP")
    if dry_run:
        return {"plan": plan.to_dict(), "cost": cost}
    if check_output(out, plan):
        log(f"{out / plan.config} is already built with this plan; reusing it")
        return load_manifest(out / plan.config)
    parts = _build_dir(out, plan.config) / "parts"
    parts.mkdir(parents=True, exist_ok=True)
    atomic_write_json(_build_dir(out, plan.config) / PLAN_NAME, plan.to_dict())
    todo = [g for g in mine if not (parts / f"{group_id(g)}.json").is_file()]
    if len(todo) < len(mine):
        log(f"resuming: {len(mine) - len(todo)} of {len(mine)} groups already trained")
    train = executor or local_executor()
    train(todo, data, spec, plan, parts, progress)
    if num_shards > 1:
        log(f"shard {shard_index} of {num_shards} done; join the shards with `stz merge`")
        return {"plan": plan.to_dict(), "parts": str(parts)}
    manifest = assemble(out, plan, all_groups, [parts], spec, data, preset.shard_size)
    log(f"wrote {manifest['counts']['checkpoints']:,} checkpoints of {manifest['counts']['runs']:,} runs to "
        f"{out / plan.config}")
    return manifest


def local_executor(workers: int | None = None) -> Callable[..., None]:
    """Train the groups on this machine, `workers` at a time (default: one per core), saving each as it finishes."""
    def execute(todo: list[list[Run]], data: TaskData, spec: ArchitectureSpec, plan: BuildPlan, parts: Path,
                progress: bool) -> None:
        from tqdm import tqdm

        total_steps = sum(plan.epochs * math.ceil(max(round(r.train_fraction * len(data.train_y)) for r in g)
                                                  / plan.batch_size) for g in todo)
        with tqdm(total=total_steps, desc="training", unit="step", disable=not progress, file=sys.stderr) as bar:
            finished = train_groups(todo, data, spec, plan.epochs, plan.checkpoint_epochs, plan.batch_size, workers,
                                    on_step=lambda: bar.update(1))
            for index, (group, checkpoints, seconds) in enumerate(finished, start=1):
                save_part(parts, group_id(group), checkpoints)
                bar.write(f"group {index}/{len(todo)} {group_id(group)} ({group[0].optimizer}, {len(group)} runs): "
                          f"{seconds:.1f} s")

    return execute


def merge_shards(out: str | Path, shard_dirs: list[str | Path], task: str, preset_name: str,
                 data_dir: str | Path | None = None, word2vec: str | Path | None = None) -> dict[str, Any]:
    """Join the parts of sharded builds (`--num-shards`) into one zoo under `out`."""
    preset, out = PRESETS[preset_name], Path(out)
    data = load_task_data(task, data_dir, preset, word2vec)
    spec = spec_for(data)
    plan, all_groups = make_plan(task, preset, data, spec)
    part_dirs = []
    for folder in map(Path, shard_dirs):
        plan_path = _build_dir(folder, plan.config) / PLAN_NAME
        if not plan_path.is_file():
            raise ZooFormatError(plan_path, "no build plan here: not a shard output of this config")
        if json.loads(plan_path.read_text()) != plan.to_dict():
            raise ZooFormatError(plan_path, "this shard was built with another plan")
        part_dirs.append(_build_dir(folder, plan.config) / "parts")
    return assemble(out, plan, all_groups, part_dirs, spec, data, preset.shard_size)
