"""What one `stz build` is asked (`BuildRequest`) and the request resolved before any training (`Build`): its data,
architecture, plan, and the runs of this shard."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from small_transformer_zoo.format.architecture import ArchitectureSpec
from small_transformer_zoo.format.splits import SPLIT_UNITS

from .data import TaskData
from .grid import DEFAULT_SHARED_SEED, PRESETS, Preset, Run, check_seed_policy, shard_runs
from .plan import BuildPlan, Placement, config_name, make_plan
from .tasks import DataRequest, Task, get_task


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
    shared_seed: int = DEFAULT_SHARED_SEED

    def __post_init__(self) -> None:
        check_seed_policy(self.seed_policy)
        if self.shared_seed != DEFAULT_SHARED_SEED and self.seed_policy == "per-run":
            raise ValueError(f"--shared-seed {self.shared_seed} needs a seed policy that shares a stream "
                             f"(shared, shared-init or shared-data); per-run seeds share none")
        if not 0 <= self.shared_seed < 2**63:
            raise ValueError(f"--shared-seed must be in 0..2**63-1, got {self.shared_seed}")
        if self.split_by not in SPLIT_UNITS:
            raise ValueError(f"unknown split unit {self.split_by!r}; choose from {list(SPLIT_UNITS)}")

    @classmethod
    def of(cls, task: str, preset: str, out: str | Path, **options: Any) -> "BuildRequest":
        """A request naming the task and preset (checked against their registries)."""
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; presets are {list(PRESETS)}")
        return cls(get_task(task), PRESETS[preset].for_task(task), Path(out), **options)

    @property
    def config(self) -> str:
        return config_name(self.task.name, self.preset.name, self.seed_policy, self.split_by, self.shared_seed)


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


def resolve(request: BuildRequest) -> Build:
    """Load the data and make the plan (errors before any training)."""
    data = load_task_data(request.task, request.data_dir, request.preset, request.word2vec, request.carve_from_test)
    spec = request.task.spec(data)
    plan, runs = make_plan(request.task, request.preset, data, spec, request.precision, request.seed_policy,
                           request.split_by, request.shared_seed)
    return Build(request, data, spec, plan, runs, shard_runs(runs, request.num_shards, request.shard_index))
