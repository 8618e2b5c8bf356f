"""The vectorized trainer: a group of runs that share an optimizer trained together (`train_group`), in parts: the
step, the evaluation, and the bookkeeping of each run's best epoch; and many groups on a machine's cores or one
accelerator (`train_groups`). The plain one-run-at-a-time trainer it is checked against is `builders.reference`.

Each run draws every random number from three streams of its own (`RunStreams`: initialisation; training subset,
batch order and crops; dropout), seeded as its seed policy says, so a run's result does not depend on which runs
share its group, and its batches not on its dropout.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from torch.nn import functional as F

from small_transformer_zoo.format.architecture import ArchitectureSpec
from small_transformer_zoo.devices import usable_cores
from small_transformer_zoo.weights.model import sinusoidal_positions

from .batched import GroupDropout, VectorizedOptimizer, batched_logits, packed_views
from .data import TaskData
from .grid import PRECISIONS, Run

BATCH_SIZE = 128
CROP_PADDING = 2
CROP_FILL = -1.0  # a black pixel after the (x - 0.5) / 0.5 normalisation: torchvision pads before normalising
FINAL_LR = 1e-5


@dataclass(frozen=True)
class Recipe:
    """How every run of a build trains (part of its plan)."""

    epochs: int
    checkpoint_epochs: tuple[int, ...]
    batch_size: int
    augment: bool
    precision: str = "fp32"


@dataclass
class Checkpoint:
    run: Run
    epoch: int
    is_best: bool
    params: np.ndarray
    metrics: dict[str, float]
    diverged: bool


RECIPE_VERSION = 2  # 1: init cut at 2 std, one stream per run, warm-up to 0.91 lr, partial last batches kept


def default_layer_draws(spec: ArchitectureSpec, generator: torch.Generator) -> None:
    """Advance `generator` as constructing the authors' model advances torch's: each `nn.Conv2d` and `nn.Linear`, in
    module order, draws its default initialisation (Kaiming-uniform weights, uniform biases) before the recipe's
    re-initialisation replaces it. A frozen word table is loaded, not drawn."""
    shapes = {info.name: info.shape for info in spec.parameters()}
    for info in spec.parameters():
        tensor = torch.empty(info.shape)
        if info.name.endswith(".bias"):
            fan_in = math.prod(shapes[info.name.removesuffix("bias") + "weight"][1:])
            torch.nn.init.uniform_(tensor, -1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in), generator=generator)
        else:
            torch.nn.init.kaiming_uniform_(tensor, a=math.sqrt(5), generator=generator)


def init_params(spec: ArchitectureSpec, std: float, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """The authors' initialisation (docs/design.md section 3): after the default layers' draws, every weight from a
    normal of mean 0 and std `std` truncated to [-2, 2] (torch's `trunc_normal_` defaults, absolute bounds: for the
    grid's stds almost no truncation), biases zero. Seeded as the authors seed torch, this gives their initial
    weights."""
    default_layer_draws(spec, generator)
    out = {}
    for info in spec.parameters():
        tensor = torch.zeros(info.shape)
        if not info.name.endswith(".bias"):
            torch.nn.init.trunc_normal_(tensor, mean=0.0, std=std, a=-2.0, b=2.0, generator=generator)
        out[info.name] = tensor
    return out


def warmup_epochs(epochs: int) -> int:
    """The first tenth of the epochs (10 of 100), at least one."""
    return max(1, round(epochs * 0.1))


def learning_rate(base: float, epoch: int, epochs: int) -> float:
    """The authors' schedule, stepped per epoch: linear warm-up from base/W to base over the first W epochs
    (`warmup_epochs`; torch's `LinearLR(start_factor=1/W, total_iters=W-1)`), so epoch W trains at the base rate;
    then cosine from base to 1e-5 over the remaining epochs (`CosineAnnealingLR(T_max=epochs-W)`)."""
    warmup = warmup_epochs(epochs)
    if epoch <= warmup:
        start = 1 / warmup
        return base * (start + (1 - start) * (epoch - 1) / max(1, warmup - 1))
    progress = (epoch - 1 - warmup) / max(1, epochs - warmup)
    return FINAL_LR + (base - FINAL_LR) * 0.5 * (1 + math.cos(math.pi * progress))


def steps_per_epoch(samples: int, batch_size: int) -> int:
    """Full batches an epoch trains: the last partial batch is dropped (`drop_last=True`), as the authors' loader
    drops it; a subset smaller than one batch trains as one batch."""
    return max(1, samples // batch_size)


def stream_seed(seed: int, stream: str) -> int:
    """The generator seed of a run's data or dropout stream, derived from that stream's seed so that no two
    streams share a sequence (the initialisation's generator takes the seed itself, as the authors seed torch)."""
    return int.from_bytes(hashlib.sha256(f"{stream}:{seed}".encode()).digest()[:8], "big") >> 1


def random_crop(images: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Crop of the original size from the padded image: images [..., C, H, W], offsets [..., 2] in 0..2p."""
    p = CROP_PADDING
    *lead, channels, height, width = images.shape
    padded = F.pad(images, (p, p, p, p), value=CROP_FILL)
    rows = offsets[..., 0, None] + torch.arange(height, device=images.device)          # [..., H]
    cols = offsets[..., 1, None] + torch.arange(width, device=images.device)           # [..., W]
    rows = rows[..., None, :, None].expand(*lead, channels, height, width + 2 * p)
    cols = cols[..., None, None, :].expand(*lead, channels, height, width)
    return padded.gather(-2, rows).gather(-1, cols)


@dataclass
class EpochDraws:
    """One epoch's random choices for M runs, made on the host once per epoch and moved to the device at once.

    order [M, max_steps * B]: each run's sample indices in batch order, padded with index 0 and weight 0 after its
    last sample; steps [M]: each run's batch count; offsets [M, max_steps * B, 2]: crop offsets (None without
    crops); dropout_seeds [M, max_steps]: per-step seeds of hashed dropout masks (None when not hashed).
    """

    order: torch.Tensor
    weight: torch.Tensor
    steps: torch.Tensor
    max_steps: int
    offsets: torch.Tensor | None
    dropout_seeds: torch.Tensor | None


class RunStreams:
    """Per-run randomness in three streams, each its own generator, consumed in the same order however runs are
    grouped and on every device:

    - init (`Run.seed`): the default layers' draws, then the initialisation (`init_params`);
    - data (`data_seed`): the run's training subset, then per epoch its sample order and crop offsets;
    - dropout (`dropout_seed`): the dropout masks (drawn per step on a CPU; as per-step seeds of hashed masks,
      drawn per epoch, elsewhere).

    Dropout never touches the data stream, so runs that share a data seed see the same batches whatever their
    dropout; the seed policy (`builders.grid.SHARED_STREAMS`) says which streams runs share."""

    def __init__(self, runs: list[Run], spec: ArchitectureSpec, n_train: int) -> None:
        self.runs = runs
        seeds = [run.stream_seeds() for run in runs]
        self.data = [torch.Generator().manual_seed(stream_seed(s["data"], "data")) for s in seeds]
        self.dropout = [torch.Generator().manual_seed(stream_seed(s["dropout"], "dropout")) for s in seeds]
        self.initial = packed_init(spec, runs, [torch.Generator().manual_seed(s["init"]) for s in seeds])
        self.subsets = [torch.randperm(n_train, generator=g)[: max(1, round(run.train_fraction * n_train))]
                        for run, g in zip(runs, self.data)]

    def epoch(self, batch_size: int, crop: bool, dropout_seeds: bool) -> EpochDraws:
        """The next epoch's draws for every run."""
        steps = [steps_per_epoch(len(subset), batch_size) for subset in self.subsets]
        width = max(steps) * batch_size
        models = len(self.runs)
        order = torch.zeros(models, width, dtype=torch.long)
        weight = torch.zeros(models, width)
        offsets = torch.full((models, width, 2), CROP_PADDING, dtype=torch.long) if crop else None
        seeds = torch.zeros(models, max(steps), dtype=torch.long) if dropout_seeds else None
        for m, (run, subset) in enumerate(zip(self.runs, self.subsets)):
            used = min(len(subset), steps[m] * batch_size)
            order[m, :used] = subset[torch.randperm(len(subset), generator=self.data[m])][:used]
            weight[m, :used] = 1.0
            if offsets is not None:
                offsets[m, :used] = torch.randint(0, 2 * CROP_PADDING + 1, (used, 2), generator=self.data[m])
            if seeds is not None and run.dropout > 0:
                seeds[m, : steps[m]] = torch.randint(0, 2**32, (steps[m],), generator=self.dropout[m])
        return EpochDraws(order, weight, torch.tensor(steps), max(steps), offsets, seeds)


@dataclass
class TrainingTensors:
    """A task's data as tensors on one device (moved once, shared by every group trained there)."""

    train_x: torch.Tensor
    train_y: torch.Tensor
    validation_x: torch.Tensor
    validation_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    embedding: torch.Tensor | None

    @classmethod
    def of(cls, data: TaskData | "TrainingTensors", device: torch.device | str) -> "TrainingTensors":
        if isinstance(data, TrainingTensors):
            return data
        move = lambda array: torch.from_numpy(array).to(device)  # noqa: E731
        return cls(move(data.train_x), move(data.train_y), move(data.validation_x), move(data.validation_y),
                   move(data.test_x), move(data.test_y), None if data.embedding is None else move(data.embedding))


def _evaluate(spec: ArchitectureSpec, packed: torch.Tensor, x: torch.Tensor, y: torch.Tensor, positions: torch.Tensor,
              embedding: torch.Tensor | None, precision: str = "fp32",
              chunk: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy and mean cross-entropy of every model (packed rows [M, n_params]) on the same inputs."""
    models = packed.shape[0]
    params = packed_views(spec, packed)
    correct = torch.zeros(models, device=packed.device)
    loss = torch.zeros(models, dtype=torch.float64, device=packed.device)
    with torch.no_grad(), autocast(packed.device, precision):
        for start in range(0, len(y), chunk):
            xs, ys = x[start : start + chunk], y[start : start + chunk]
            logits = batched_logits(spec, params, xs.expand(models, *xs.shape), positions, None, embedding).float()
            correct += (logits.argmax(-1) == ys).sum(-1)
            loss += F.cross_entropy(logits.transpose(1, 2), ys.expand(models, -1), reduction="none").sum(-1).double()
    # Counts divided in float64 on the host: 457 of 1,000 is stored as 0.457, not float32's 0.45699998736.
    return correct.cpu().double().numpy() / len(y), loss.cpu().double().numpy() / len(y)


def autocast(device: torch.device, precision: str) -> torch.autocast:
    """bf16 autocast for the matmuls where `precision` is "bf16" (weights and optimizer state stay float32)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {list(PRECISIONS)}, got {precision!r}")
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16")


def packed_init(spec: ArchitectureSpec, runs: list[Run], generators: list[torch.Generator]) -> torch.Tensor:
    """Initial packed rows [M, n_params] of the runs, each drawn from its own generator."""
    rows = []
    for run, generator in zip(runs, generators):
        init = init_params(spec, run.w_init_std, generator)
        rows.append(torch.cat([init[p.name].reshape(-1) for p in spec.parameters()]))
    return torch.stack(rows)


def train_group(runs: list[Run], data: TaskData | TrainingTensors, spec: ArchitectureSpec, recipe: Recipe,
                device: torch.device | str = "cpu", on_step: Callable[[], None] | None = None,
                hashed_dropout: bool | None = None) -> list[Checkpoint]:
    """Train runs that share an optimizer in lockstep on `device`; return their checkpoints (the recipe's epochs,
    and the best).

    `hashed_dropout` (default: on any device but the CPU) draws dropout masks from per-step seeds that each epoch's
    host draws include (one set of kernels for the whole group); otherwise each step's masks come from the runs'
    dropout generators on the host.

    Every tensor of the step (weights, optimizer state, data, masks, metrics) lives on `device`, and the host only
    prepares each epoch's draws, so a step never waits for the device. Validation accuracy picks the best epoch, so
    it is measured every epoch; test metrics only where a checkpoint is kept (the listed epochs, then the best
    epoch of each run where it is not one of them).
    """
    return GroupTraining(runs, data, spec, recipe, device, on_step, hashed_dropout).run()


@dataclass
class EpochTotals:
    """What an epoch's steps add up per run: correctly classified and seen training samples, and their loss."""

    correct: torch.Tensor
    seen: torch.Tensor
    loss: torch.Tensor


class BestEpochs:
    """Each run's best epoch by validation accuracy (diverged epochs never count), and the checkpoints it keeps."""

    def __init__(self, runs: list[Run]) -> None:
        self.runs = runs
        self.accuracy = np.full(len(runs), -1.0)
        self.best: list[Checkpoint | None] = [None] * len(runs)
        self.saved: list[Checkpoint] = []

    def record(self, records: list[Checkpoint], validation_accuracy: np.ndarray, keep: bool) -> None:
        for m, record in enumerate(records):
            if keep:
                self.saved.append(record)
            if not record.diverged and validation_accuracy[m] > self.accuracy[m]:
                self.accuracy[m], self.best[m] = validation_accuracy[m], record

    def chosen(self) -> list[Checkpoint]:
        """Each run's best epoch (its last kept one when every epoch diverged)."""
        return [self.best[m] or next(c for c in reversed(self.saved) if c.run is run) for m, run in enumerate(self.runs)]


class GroupTraining:
    """The state of one group's training (`train_group`): weights, optimizer, dropout and random streams."""

    def __init__(self, runs: list[Run], data: TaskData | TrainingTensors, spec: ArchitectureSpec, recipe: Recipe,
                 device: torch.device | str, on_step: Callable[[], None] | None, hashed_dropout: bool | None) -> None:
        optimizers = {run.optimizer for run in runs}
        if len(optimizers) != 1:
            raise ValueError(f"a group must share one optimizer, got {sorted(optimizers)}")
        self.runs, self.spec, self.recipe, self.on_step = runs, spec, recipe, on_step
        self.device = torch.device(device)
        self.tensors = TrainingTensors.of(data, self.device)
        self.streams = RunStreams(runs, spec, len(self.tensors.train_y))
        self.packed = self.streams.initial.to(self.device).requires_grad_()
        self.optimizer = VectorizedOptimizer(runs[0].optimizer, self.packed, torch.tensor([run.l2 for run in runs]))
        self.hashed = self.device.type != "cpu" if hashed_dropout is None else hashed_dropout
        self.dropout = GroupDropout([run.dropout for run in runs], self.streams.dropout,
                                    sites=2 * spec.num_blocks + 1, device=self.device)
        self.positions = sinusoidal_positions(spec.num_tokens, spec.d_model).to(self.device)
        self.crop = recipe.augment and spec.modality == "vision"
        tokens = spec.num_tokens if spec.modality == "vision" else self.tensors.train_x.shape[1]
        self.token_shape = (recipe.batch_size, tokens, spec.d_model)
        self.diverged = torch.zeros(len(runs), dtype=torch.bool, device=self.device)
        self.best = BestEpochs(runs)

    def run(self) -> list[Checkpoint]:
        recipe = self.recipe
        draw_epoch = partial(self.streams.epoch, recipe.batch_size, self.crop,
                             self.hashed and bool(self.dropout.drawing))
        # The epoch draws use the data streams (and, hashed, the dropout streams' per-step seeds); masks drawn per
        # step use the dropout streams alone. So the next epoch's draws are made while this one trains.
        with ThreadPoolExecutor(1) as prefetch:
            upcoming = prefetch.submit(draw_epoch)
            for epoch in range(1, recipe.epochs + 1):
                draws = upcoming.result()
                if epoch < recipe.epochs:
                    upcoming = prefetch.submit(draw_epoch)
                totals = self.train_epoch(epoch, draws)
                self.evaluate(epoch, totals)
        return self.finish()

    def train_epoch(self, epoch: int, draws: EpochDraws) -> EpochTotals:
        """One epoch of steps over every run's batches."""
        device, size, models = self.device, self.recipe.batch_size, len(self.runs)
        lr = torch.tensor([learning_rate(run.learning_rate, epoch, self.recipe.epochs) for run in self.runs]).to(device)
        order, weights, steps = draws.order.to(device), draws.weight.to(device), draws.steps.to(device)
        offsets = None if draws.offsets is None else draws.offsets.to(device)
        seeds = None if draws.dropout_seeds is None else draws.dropout_seeds.to(device)
        totals = EpochTotals(torch.zeros(models, device=device), torch.zeros(models, device=device),
                             torch.zeros(models, dtype=torch.float64, device=device))
        host_steps = draws.steps.tolist()
        for step in range(draws.max_steps):
            batch = slice(step * size, (step + 1) * size)
            active = (step < steps) & ~self.diverged
            self.step(order[:, batch], weights[:, batch], None if offsets is None else offsets[:, batch],
                      None if seeds is None else seeds[:, step], active, lr, totals,
                      [step < count for count in host_steps])
            if self.on_step:
                self.on_step()
        return totals

    def step(self, index: torch.Tensor, weight: torch.Tensor, offsets: torch.Tensor | None,
             seeds: torch.Tensor | None, active: torch.Tensor, lr: torch.Tensor, totals: EpochTotals,
             stepping: list[bool]) -> None:
        """One optimizer step of every active run on its batch (`index` [M, B] into the training data); `stepping`:
        the runs whose epoch has this step (on the host)."""
        spec = self.spec
        inputs = self.tensors.train_x[index]
        if self.crop:
            inputs = random_crop(inputs, offsets)
        self.dropout.draw(self.token_shape, seeds, stepping)
        with autocast(self.device, self.recipe.precision):
            logits = batched_logits(spec, packed_views(spec, self.packed), inputs, self.positions, self.dropout,
                                    self.tensors.embedding)
        labels = self.tensors.train_y[index]
        # Rows of [models * batch, classes]: the gradient that flows back is then laid out the same way whatever the
        # group's size, and so are the sums (bias gradients) taken over it.
        per_sample = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), reduction="none"
                                     ).view(labels.shape)
        per_model = (per_sample * weight).sum(-1) / weight.sum(-1).clamp_min(1.0)
        total = torch.where(active, per_model, torch.zeros_like(per_model)).nan_to_num().sum()
        self.packed.grad = None
        total.backward()
        self.optimizer.step(lr, active)
        with torch.no_grad():
            self.diverged |= ~self.packed.isfinite().all(1) | ~per_model.isfinite()
            counted = active.float()[:, None] * weight
            totals.correct += ((logits.argmax(-1) == labels).float() * counted).sum(-1)
            totals.loss += (per_sample.detach() * counted).sum(-1).double()
            totals.seen += counted.sum(-1)

    def _evaluate(self, rows: torch.Tensor, split: str) -> tuple[np.ndarray, np.ndarray]:
        x, y = (self.tensors.validation_x, self.tensors.validation_y) if split == "validation" else \
            (self.tensors.test_x, self.tensors.test_y)
        return _evaluate(self.spec, rows, x, y, self.positions, self.tensors.embedding, self.recipe.precision)

    def evaluate(self, epoch: int, totals: EpochTotals) -> None:
        """The epoch's metrics for every run (validation always, test where a checkpoint is kept), recorded."""
        rows = self.packed.detach().clone()
        val_acc, val_loss = self._evaluate(rows, "validation")
        keep = epoch in self.recipe.checkpoint_epochs
        test_acc, test_loss = self._evaluate(rows, "test") if keep else (None, None)
        host_rows = rows.cpu().numpy()
        correct, seen, loss = totals.correct.cpu(), totals.seen.cpu(), totals.loss.cpu()
        diverged = self.diverged.cpu()
        records = []
        for m, run in enumerate(self.runs):
            metrics = {"train_accuracy": float(correct[m]) / float(seen[m]) if seen[m] else float("nan"),
                       "train_loss": float(loss[m]) / float(seen[m]) if seen[m] else float("nan"),
                       "validation_accuracy": float(val_acc[m]), "validation_loss": float(val_loss[m])}
            if keep:
                metrics |= {"test_accuracy": float(test_acc[m]), "test_loss": float(test_loss[m])}
            records.append(Checkpoint(run, epoch, False, host_rows[m].copy(), metrics, bool(diverged[m])))
        self.best.record(records, val_acc, keep)

    def finish(self) -> list[Checkpoint]:
        """The kept checkpoints and each run's best one, tested where its epoch was not kept."""
        chosen = self.best.chosen()
        untested = [m for m, c in enumerate(chosen) if "test_accuracy" not in c.metrics]
        if untested:
            rows = torch.from_numpy(np.stack([chosen[m].params for m in untested])).to(self.device)
            test_acc, test_loss = self._evaluate(rows, "test")
            for m, acc, loss in zip(untested, test_acc, test_loss):
                chosen[m].metrics |= {"test_accuracy": float(acc), "test_loss": float(loss)}
        saved = self.best.saved + [Checkpoint(c.run, c.epoch, True, c.params, c.metrics, c.diverged) for c in chosen]
        for c in saved:
            if c.diverged:
                c.metrics = {k: (float("nan") if "loss" in k else v) for k, v in c.metrics.items()}
        return saved


@contextmanager
def intra_op_threads(count: int) -> Iterator[None]:
    """torch's intra-op thread count set for the block and restored after it."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def train_groups(groups: list[list[Run]], data: TaskData, spec: ArchitectureSpec, recipe: Recipe,
                 device: torch.device | str = "cpu", workers: int | None = None,
                 on_step: Callable[[], None] | None = None) -> Iterator[tuple[list[Run], list[Checkpoint], float]]:
    """Train groups and yield (group, checkpoints, seconds) as each ends.

    On a CPU, `workers` groups at a time (default: one per core this process may use), each on one core (one
    intra-op thread, in threads of this process): at these sizes that beats one group whose every kernel is split
    over all cores (BENCHMARKS.md). On an accelerator, one group at a time, the data moved there once. A group's
    result does not depend on the groups trained beside it or on where it was trained.
    """
    device = torch.device(device)
    tensors = TrainingTensors.of(data, device)

    def train(group: list[Run]) -> tuple[list[Run], list[Checkpoint], float]:
        started = time.perf_counter()
        checkpoints = train_group(group, tensors, spec, recipe, device, on_step)
        return group, checkpoints, time.perf_counter() - started

    count = max(1, min(workers or usable_cores(), len(groups))) if device.type == "cpu" else 1
    if count == 1:
        yield from map(train, groups)
        return
    with intra_op_threads(1), ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(train, group) for group in groups]
        try:
            for future in as_completed(futures):
                yield future.result()
        finally:
            for future in futures:
                future.cancel()
