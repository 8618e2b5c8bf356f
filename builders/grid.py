"""The training grid (docs/design.md section 3, the paper's Table 4), presets, run ids, seeds, groups and shards."""

from __future__ import annotations

import hashlib
import itertools
import math
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from small_transformer_zoo.format.metadata import OPTIMIZERS

PRECISIONS = ("fp32", "bf16")  # bf16: matmuls autocast to bfloat16; weights, optimizer state and checkpoints float32
PAPER_GRID = {
    "sgd": {
        "train_fraction": [1.0, 0.9, 0.8, 0.7],
        "dropout": [0.2, 0.15, 0.1, 0.05, 0.0],
        "learning_rate": [1e-3, 3e-3, 5e-3, 7e-3, 1e-2, 3e-2, 5e-2, 7e-2],
        "w_init_std": [0.1, 0.15, 0.2, 0.25, 0.3],
        "l2": [1e-8, 1e-7, 1e-6, 1e-4, 1e-2],
    },
    "adam": {
        "train_fraction": [1.0, 0.9, 0.8, 0.7],
        "dropout": [0.2, 0.15, 0.1, 0.05, 0.0],
        "learning_rate": [3e-4, 5e-4, 1e-3, 3e-3, 5e-3, 1e-2, 3e-2, 5e-2],
        "w_init_std": [0.1, 0.2, 0.3, 0.4, 0.5],
        "l2": [1e-8, 1e-7, 1e-6, 1e-4, 1e-2],
    },
}
FAMILY = {"sgd": "sgd", "sgd_momentum": "sgd", "adam": "adam", "rmsprop": "adam"}
HYPER_ORDER = ("train_fraction", "dropout", "learning_rate", "w_init_std", "l2")


@dataclass(frozen=True)
class Preset:
    """How much of the recipe a build runs."""

    name: str
    epochs: int
    runs: int | None          # None: the whole grid; else this many runs, chosen by `selection`
    max_train_samples: int | None
    group_size: int           # runs trained together in one vectorized step on a CPU (`--group-size auto`)
    batch_size: int = 128     # the paper's; the small presets take smaller batches for more optimizer steps
    shard_size: int = 2048
    selection: str = "stratified"   # "stratified" (every value of every hyperparameter), "sweep" (see sweep_sample)
    #                                 or "families" (stratified settings, each at every L2 value)
    augment: bool = True      # random-crop augmentation of images
    every_epoch: bool = False  # a checkpoint at every epoch instead of the scaled 1, 50, 75, 100
    max_validation_samples: int | None = None  # the validation hold-out is measured every epoch: cap its cost
    per_task: dict[str, dict[str, int]] = field(default_factory=dict, compare=False)  # task -> settings it changes

    def for_task(self, task: str) -> "Preset":
        """The preset as it builds `task`: a task whose runs cost more per sample trains on fewer samples, so every
        task's build of a preset fits the same time (settings chosen with `benchmarks/calibrate_preset.py`)."""
        return replace(self, **self.per_task.get(task, {}))


PRESETS = {
    "paper": Preset("paper", epochs=100, runs=None, max_train_samples=None, group_size=32),
    "medium": Preset("medium", epochs=16, runs=240, max_train_samples=7_000, group_size=15, batch_size=16,
                     selection="sweep", augment=False, every_epoch=True, max_validation_samples=2_000),
    "wide": Preset("wide", epochs=8, runs=1500, max_train_samples=3_600, group_size=15, batch_size=16,
                   augment=False, max_validation_samples=1_000, per_task={"agnews": {"max_train_samples": 3_000, "runs": 1_600}}),
    "mini": Preset("mini", epochs=6, runs=132, max_train_samples=None, group_size=10, batch_size=16,
                   selection="sweep", augment=False),
    "families": Preset("families", epochs=8, runs=480, max_train_samples=3_600, group_size=15, batch_size=16,
                       selection="families", augment=False, max_validation_samples=1_000),
    # The paper's regime as far as the embedded digits carry it: 40 epochs, where the share of runs above 0.8 test
    # accuracy stops growing (benchmarks/calibrate_preset.py, BENCHMARKS.md "The presets").
    "trained": Preset("trained", epochs=40, runs=600, max_train_samples=3_600, group_size=15, batch_size=16,
                      augment=False, max_validation_samples=1_000),
    "tiny": Preset("tiny", epochs=2, runs=20, max_train_samples=256, group_size=5),
}
SEED_POLICIES = ("per-run", "shared", "shared-init", "shared-data")
DEFAULT_SHARED_SEED = 3  # the original release's one seed for every run
STREAMS = ("init", "data", "dropout")
# Which of a run's random streams come from the build's shared seed under each policy (the rest are the run's own).
SHARED_STREAMS = {"per-run": (), "shared": STREAMS, "shared-init": ("init",), "shared-data": ("data",)}


@dataclass(frozen=True)
class Run:
    """One run of the grid: its hyperparameters and the seeds of its three random streams. `seed` seeds the
    initialisation; `data_seed` (subset, batch order, crops) and `dropout_seed` (dropout masks) are None where they
    equal `seed`."""

    run_id: str
    optimizer: str
    train_fraction: float
    dropout: float
    learning_rate: float
    w_init_std: float
    l2: float
    seed: int
    data_seed: int | None = None
    dropout_seed: int | None = None

    def hyperparameters(self) -> dict[str, float | str]:
        """The metadata's hyperparameter columns, `seed` (the initialisation's) among them."""
        out = asdict(self)
        for name in ("run_id", "data_seed", "dropout_seed"):
            out.pop(name)
        return out

    def stream_seeds(self) -> dict[str, int]:
        """The seed of each random stream: init, data and dropout."""
        return {"init": self.seed, "data": self.seed if self.data_seed is None else self.data_seed,
                "dropout": self.seed if self.dropout_seed is None else self.dropout_seed}


def check_seed_policy(policy: str) -> None:
    if policy not in SEED_POLICIES:
        raise ValueError(f"unknown seed policy {policy!r}; choose from {list(SEED_POLICIES)}")


def own_seed(run_id: str) -> int:
    """A run's own seed, fixed by its id."""
    return int.from_bytes(hashlib.sha256(f"seed:{run_id}".encode()).digest()[:4], "big") & 0x7FFFFFFF


def run_seed(run_id: str, policy: str = "per-run", shared_seed: int = DEFAULT_SHARED_SEED) -> int:
    """The seed of a run's initialisation. `per-run` (the default) and `shared-data`: its own, fixed by its id, so
    runs start from independent draws. `shared` and `shared-init`: the build's one shared seed (the original
    release's 3 unless chosen), so runs share their initial draw, made with each run's init std."""
    return run_seeds(run_id, policy, shared_seed)["init"]


def run_seeds(run_id: str, policy: str = "per-run", shared_seed: int = DEFAULT_SHARED_SEED) -> dict[str, int]:
    """The seed of each of a run's random streams under a policy (`SHARED_STREAMS`): `shared` shares all three
    (one initial draw, one training subset per train fraction, one batch order and set of crops, one set of
    dropout masks per rate, as in the original release); `shared-init` only the initialisation; `shared-data`
    only the subset, batch order and crops."""
    check_seed_policy(policy)
    own = own_seed(run_id)
    return {stream: shared_seed if stream in SHARED_STREAMS[policy] else own for stream in STREAMS}


def make_run(run_id: str, optimizer: str, hyperparameters: tuple, policy: str = "per-run",
             shared_seed: int = DEFAULT_SHARED_SEED) -> Run:
    """A run with its streams' seeds under `policy` (data and dropout stored only where they differ from init)."""
    seeds = run_seeds(run_id, policy, shared_seed)
    other = lambda stream: None if seeds[stream] == seeds["init"] else seeds[stream]  # noqa: E731
    return Run(run_id, optimizer, *hyperparameters, seed=seeds["init"], data_seed=other("data"),
               dropout_seed=other("dropout"))


def full_grid(task: str, seed_policy: str = "per-run", shared_seed: int = DEFAULT_SHARED_SEED) -> list[Run]:
    """All 16,000 runs of the paper's grid for a task, in a fixed order; ids name task, optimizer and index."""
    check_seed_policy(seed_policy)
    runs = []
    for optimizer in OPTIMIZERS:
        values = PAPER_GRID[FAMILY[optimizer]]
        for index, combo in enumerate(itertools.product(*(values[k] for k in HYPER_ORDER))):
            runs.append(make_run(f"{task}-{optimizer}-{index:04d}", optimizer, combo, seed_policy, shared_seed))
    return runs


def stratified_sample(runs: list[Run], count: int, complete: tuple[str, ...] = ()) -> list[Run]:
    """`count` runs spread evenly over optimizers; per optimizer a balanced design of its grid: each value of every
    hyperparameter is taken equally often (counts differ by at most one), values of different hyperparameters are
    paired by seeded shuffles, and no combination is taken twice (deterministic).

    `complete`: hyperparameters taken at every value for each setting of the others (`families`: every L2 for
    each sampled setting, so each family of runs that differ only in L2 is whole)."""
    per = math.ceil(count / len(OPTIMIZERS))
    picked = []
    for optimizer in OPTIMIZERS:
        pool = [r for r in runs if r.optimizer == optimizer]
        if per >= len(pool):
            picked += pool
            continue
        values = PAPER_GRID[FAMILY[optimizer]]
        sampled = [name for name in HYPER_ORDER if name not in complete]
        settings = math.ceil(per / math.prod(len(values[name]) for name in complete))
        rng = np.random.default_rng(int.from_bytes(hashlib.sha256(f"sample:{optimizer}".encode()).digest()[:4], "big"))
        columns = [rng.permutation(np.arange(settings) % len(values[name])) for name in sampled]
        design = np.stack(columns, axis=1)
        _make_rows_distinct(design, rng)
        by_levels = {tuple(values[name].index(r.hyperparameters()[name]) for name in HYPER_ORDER): r for r in pool}
        for row in design:
            levels = dict(zip(sampled, (int(v) for v in row)))
            for rest in itertools.product(*(range(len(values[name])) for name in complete)):
                levels.update(zip(complete, rest))
                picked.append(by_levels[tuple(levels[name] for name in HYPER_ORDER)])
    return sorted(picked, key=lambda r: r.run_id)


def _make_rows_distinct(design: np.ndarray, rng: np.random.Generator) -> None:
    """Swap single values between rows until no two rows of `design` are equal (each column keeps its values)."""
    while True:
        rows = [tuple(row) for row in design]
        seen: dict[tuple, int] = {}
        repeats = [i for i, row in enumerate(rows) if seen.setdefault(row, i) != i]
        if not repeats:
            return
        i = repeats[0]
        j, k = int(rng.integers(len(design))), int(rng.integers(design.shape[1]))
        design[[i, j], k] = design[[j, i], k]


SWEEP_BASE = {"train_fraction": 1.0, "dropout": 0.0, "w_init_std": 0.2, "l2": 1e-6}


def sweep_sample(runs: list[Run], count: int) -> list[Run]:
    """`count` runs spread evenly over optimizers. Per optimizer: every grid learning rate at a base setting that
    trains well (init std 0.2, no dropout, all data, L2 1e-6), then further sweeps over the learning rates whose
    other hyperparameters step through their grid values with a fixed stride (no combination twice). Small zoos
    then span failed, slow and well-trained runs instead of mostly slow ones: a uniform sample of the grid trains
    too little in a few epochs to reach high accuracy."""
    per = math.ceil(count / len(OPTIMIZERS))
    by_key = {(r.optimizer, *(r.hyperparameters()[k] for k in HYPER_ORDER)): r for r in runs}
    others = [k for k in HYPER_ORDER if k != "learning_rate"]
    picked = []
    for optimizer in OPTIMIZERS:
        values = PAPER_GRID[FAMILY[optimizer]]
        rates = values["learning_rate"]
        combos = list(itertools.product(*(values[k] for k in others)))
        stride = next(s for s in range(int(len(combos) * 0.618), len(combos)) if math.gcd(s, len(combos)) == 1)
        chosen = [by_key[(optimizer, *({**SWEEP_BASE, "learning_rate": lr}[k] for k in HYPER_ORDER))]
                  for lr in rates][:per]
        for k in itertools.count():
            if len(chosen) >= min(per, len(rates) * len(combos)):
                break
            setting = dict(zip(others, combos[(k * stride) % len(combos)]), learning_rate=rates[k % len(rates)])
            run = by_key[(optimizer, *(setting[name] for name in HYPER_ORDER))]
            if run not in chosen:
                chosen.append(run)
        picked += chosen
    return sorted(picked, key=lambda r: r.run_id)


def preset_runs(task: str, preset: Preset, seed_policy: str = "per-run",
                shared_seed: int = DEFAULT_SHARED_SEED) -> list[Run]:
    runs = full_grid(task, seed_policy, shared_seed)
    if preset.runs is None:
        return runs
    if preset.selection == "sweep":
        return sweep_sample(runs, preset.runs)
    return stratified_sample(runs, preset.runs, ("l2",) if preset.selection == "families" else ())


def checkpoint_epochs(epochs: int, every_epoch: bool = False) -> list[int]:
    """The paper's 1, 50, 75, 100 of 100 epochs, scaled to `epochs` (without repeats), or every epoch."""
    if every_epoch:
        return list(range(1, epochs + 1))
    return sorted({1, max(1, round(epochs * 0.5)), max(1, round(epochs * 0.75)), epochs})


def groups(runs: list[Run], group_size: int) -> list[list[Run]]:
    """Runs trained together: same optimizer (one vectorized update rule), in run-id order, fixed size."""
    out = []
    for optimizer in OPTIMIZERS:
        pool = sorted((r for r in runs if r.optimizer == optimizer), key=lambda r: r.run_id)
        out += [pool[i : i + group_size] for i in range(0, len(pool), group_size)]
    return out


def group_id(group: list[Run]) -> str:
    return f"{group[0].run_id}--{group[-1].run_id}"


def shard_runs(runs: list[Run], num_shards: int, shard_index: int) -> list[Run]:
    """Deterministic round-robin split of a plan's runs for array jobs (Slurm, Kubernetes indexed jobs, Ray); each
    shard groups its own runs, so shards may train with different group sizes or devices."""
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise ValueError(f"shard index {shard_index} is not in 0..{num_shards - 1}")
    return runs[shard_index::num_shards]
