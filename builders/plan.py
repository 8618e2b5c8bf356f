"""A build's plan and its cost: what a zoo is (`BuildPlan`: task, preset, recipe, seeding, split rule, data), its
runs (`make_plan`), its config name, and the estimates a build is started or refused on (`estimate_cost`,
`estimated_hours`, `check_duration`), with where it trains (`Placement`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch

from small_transformer_zoo.format.architecture import ArchitectureSpec
from small_transformer_zoo.devices import usable_cores

from .data import TaskData
from .grid import DEFAULT_SHARED_SEED, Preset, Run, checkpoint_epochs, preset_runs
from .tasks import Task
from .trainer import RECIPE_VERSION, Recipe, steps_per_epoch

CPU_GFLOPS_PER_CORE = 22.4   # measured: `wide` (278.5 TFLOP) built in 103.7 min on 2 cores (BENCHMARKS.md)
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
    shared_seed: int | None = None   # the seed of the streams a policy other than per-run shares
    recipe_version: int = RECIPE_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def recipe(self) -> Recipe:
        return Recipe(self.epochs, tuple(self.checkpoint_epochs), self.batch_size, self.augment, self.precision)


def config_name(task: str, preset: str, seed_policy: str = "per-run", split_by: str = "run",
                shared_seed: int = DEFAULT_SHARED_SEED) -> str:
    """`<task>-<preset>` (`<task>` for the paper's), marked when its seeding or split rule is not the default:
    `-shared-seed`, `-shared-init` or `-shared-data`, followed by the shared seed where it is not the original
    release's 3 (`-shared-seed-7`), and `-family-split`."""
    name = task if preset == "paper" else f"{task}-{preset}"
    if seed_policy != "per-run":
        name += "-shared-seed" if seed_policy == "shared" else f"-{seed_policy}"
        name += "" if shared_seed == DEFAULT_SHARED_SEED else f"-{shared_seed}"
    return name + ("-family-split" if split_by == "family" else "")


@dataclass(frozen=True)
class Placement:
    """Where and how a build trains: device, group size and CPU workers (none of it changes the zoo)."""

    device: torch.device
    group_size: int
    workers: int | None = None


def make_plan(task: Task, preset: Preset, data: TaskData, spec: ArchitectureSpec, precision: str = "fp32",
              seed_policy: str = "per-run", split_by: str = "run",
              shared_seed: int = DEFAULT_SHARED_SEED) -> tuple[BuildPlan, list[Run]]:
    """The plan and its runs in run-id order. How runs are grouped is not part of the plan: each run trains the
    same whatever its group, so any group size, device count or shard split builds the same zoo."""
    runs = sorted(preset_runs(task.name, preset, seed_policy, shared_seed), key=lambda r: r.run_id)
    plan = BuildPlan(task.name, preset.name, config_name(task.name, preset.name, seed_policy, split_by, shared_seed),
                     preset.epochs, checkpoint_epochs(preset.epochs, preset.every_epoch), preset.batch_size,
                     preset.augment, precision, len(runs), spec.to_dict(), data.source.get("sha256", ""),
                     seed_policy, split_by, None if seed_policy == "per-run" else shared_seed)
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
    samples = sum(steps_per_epoch(round(r.train_fraction * len(data.train_y)), plan.batch_size) * plan.batch_size
                  for r in runs) * plan.epochs
    tested = len(plan.checkpoint_epochs) + 1
    eval_samples = len(runs) * (plan.epochs * len(data.validation_y) + tested * len(data.test_y))
    flops = samples * training_flops_per_sample(spec) + eval_samples * training_flops_per_sample(spec) / 3
    return {"runs": len(runs), "model_epochs": len(runs) * plan.epochs, "train_samples": samples,
            "tflop": flops / 1e12}


def estimated_hours(cost: dict[str, float], placement: Placement) -> float:
    """A build's hours at this project's measured CPU rate per core, or an assumed accelerator rate."""
    if placement.device.type == "cpu":
        rate = CPU_GFLOPS_PER_CORE * 1e9 * (placement.workers or usable_cores())
    else:
        rate = GPU_TFLOPS * 1e12
    return cost["tflop"] * 1e12 / rate / 3600


def duration_text(hours: float) -> str:
    """An estimate in words, as `--dry-run` prints it and the README quotes it."""
    if hours * 60 < 1:
        return "under a minute"
    return f"about {round(hours * 60)} minutes" if hours < 1 else f"about {hours:,.1f} hours"


def check_duration(hours: float, confirm: bool = False, max_hours: float | None = None) -> None:
    """A long build runs only when asked for: `confirm` (--yes), or a `max_hours` that the estimate fits in."""
    if max_hours is not None:
        if hours > max_hours:
            raise ValueError(f"this build is estimated at {hours:,.1f} hours, more than --max-hours "
                             f"{max_hours:g}; choose a smaller preset, shard it (--num-shards) or raise it")
        return
    if hours > CONFIRM_HOURS and not confirm:
        raise ValueError(f"this build is estimated at {hours:,.1f} hours on this device; pass --yes (or "
                         f"--max-hours H) to start it, or shard it over machines with --num-shards")
