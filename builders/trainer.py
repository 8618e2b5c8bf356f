"""Training a group of runs together (the vectorized trainer) and one run alone (the plain PyTorch baseline).

Each run draws every random number (initialisation, its training subset, batch order, crop offsets, dropout) from
its own generator, seeded by its run id, so a run's result does not depend on which runs share its group.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from small_transformer_zoo.architecture import ArchitectureSpec
from small_transformer_zoo.model import ZooTransformer, sinusoidal_positions

from .batched import GroupDropout, VectorizedOptimizer, batched_logits, packed_views
from .data import TaskData
from .grid import Run

BATCH_SIZE = 128
CROP_PADDING = 2
CROP_FILL = -1.0  # a black pixel after the (x - 0.5) / 0.5 normalisation: torchvision pads before normalising
FINAL_LR = 1e-5


@dataclass
class Checkpoint:
    run: Run
    epoch: int
    is_best: bool
    params: np.ndarray
    metrics: dict[str, float]
    diverged: bool


def init_params(spec: ArchitectureSpec, std: float, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Weights truncated normal (std, cut at 2 std), biases zero (SPEC section 3)."""
    out = {}
    for info in spec.parameters():
        tensor = torch.zeros(info.shape)
        if not info.name.endswith(".bias"):
            torch.nn.init.trunc_normal_(tensor, std=std, a=-2 * std, b=2 * std, generator=generator)
        out[info.name] = tensor
    return out


def learning_rate(base: float, epoch: int, epochs: int) -> float:
    """Linear warm-up from base/10 over the first tenth of the epochs (10 of 100), then cosine to 1e-5."""
    warmup = max(1, round(epochs * 0.1))
    if epoch <= warmup:
        return base * (0.1 + 0.9 * (epoch - 1) / warmup)
    progress = (epoch - 1 - warmup) / max(1, epochs - warmup)
    return FINAL_LR + (base - FINAL_LR) * 0.5 * (1 + math.cos(math.pi * progress))


def random_crop(images: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """Crop of the original size from the zero-padded image: images [..., C, H, W], offsets [..., 2] in 0..2p."""
    p = CROP_PADDING
    *lead, channels, height, width = images.shape
    padded = F.pad(images, (p, p, p, p), value=CROP_FILL)
    rows = offsets[..., 0, None] + torch.arange(height)                     # [..., H]
    cols = offsets[..., 1, None] + torch.arange(width)                      # [..., W]
    rows = rows[..., None, :, None].expand(*lead, channels, height, width + 2 * p)
    cols = cols[..., None, None, :].expand(*lead, channels, height, width)
    return padded.gather(-2, rows).gather(-1, cols)


class _RunStreams:
    """Per-run randomness: one generator per run, consumed in the same order however runs are grouped."""

    def __init__(self, runs: list[Run], data: TaskData) -> None:
        self.generators = [torch.Generator().manual_seed(run.seed) for run in runs]
        n_train = len(data.train_y)
        self.subsets = []
        for run, generator in zip(runs, self.generators):
            pool = torch.randperm(n_train, generator=generator)
            self.subsets.append(pool[: max(1, round(run.train_fraction * n_train))])


def _evaluate(spec: ArchitectureSpec, packed: torch.Tensor, x: torch.Tensor, y: torch.Tensor, positions: torch.Tensor,
              embedding: torch.Tensor | None, chunk: int = 250) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy and mean cross-entropy of every model (packed rows [M, n_params]) on the same inputs."""
    models = packed.shape[0]
    params = packed_views(spec, packed)
    correct = torch.zeros(models)
    loss = torch.zeros(models, dtype=torch.float64)
    with torch.no_grad():
        for start in range(0, len(y), chunk):
            xs, ys = x[start : start + chunk], y[start : start + chunk]
            logits = batched_logits(spec, params, xs.expand(models, *xs.shape), positions, None, embedding)
            correct += (logits.argmax(-1) == ys).sum(-1)
            loss += F.cross_entropy(logits.transpose(1, 2), ys.expand(models, -1), reduction="none").sum(-1).double()
    return (correct / len(y)).numpy(), (loss / len(y)).numpy()


def packed_init(spec: ArchitectureSpec, runs: list[Run], generators: list[torch.Generator]) -> torch.Tensor:
    """Initial packed rows [M, n_params] of the runs, each drawn from its own generator."""
    rows = []
    for run, generator in zip(runs, generators):
        init = init_params(spec, run.w_init_std, generator)
        rows.append(torch.cat([init[p.name].reshape(-1) for p in spec.parameters()]))
    return torch.stack(rows)


def train_group(runs: list[Run], data: TaskData, spec: ArchitectureSpec, epochs: int, checkpoint_epochs: list[int],
                batch_size: int = BATCH_SIZE, augment: bool = True,
                on_step: Callable[[], None] | None = None) -> list[Checkpoint]:
    """Train runs that share an optimizer in lockstep; return their checkpoints (epochs listed, and the best).

    Validation accuracy picks the best epoch, so it is measured every epoch; test metrics only where a
    checkpoint is kept (the listed epochs, then the best epoch of each run where it is not one of them).
    """
    optimizers = {run.optimizer for run in runs}
    if len(optimizers) != 1:
        raise ValueError(f"a group must share one optimizer, got {sorted(optimizers)}")
    models = len(runs)
    streams = _RunStreams(runs, data)
    packed = packed_init(spec, runs, streams.generators).requires_grad_()
    optimizer = VectorizedOptimizer(runs[0].optimizer, packed, torch.tensor([run.l2 for run in runs]))
    dropout = GroupDropout([run.dropout for run in runs], streams.generators, sites=2 * spec.num_blocks + 1)
    positions = sinusoidal_positions(spec.num_tokens, spec.d_model)
    embedding = None if data.embedding is None else torch.from_numpy(data.embedding)
    train_x, train_y = torch.from_numpy(data.train_x), torch.from_numpy(data.train_y)
    val_x, val_y = torch.from_numpy(data.validation_x), torch.from_numpy(data.validation_y)
    test_x, test_y = torch.from_numpy(data.test_x), torch.from_numpy(data.test_y)
    crop = augment and spec.modality == "vision"
    token_shape = (batch_size, spec.num_tokens if spec.modality == "vision" else train_x.shape[1], spec.d_model)
    diverged = torch.zeros(models, dtype=torch.bool)
    best_accuracy = np.full(models, -1.0)
    best: list[Checkpoint | None] = [None] * models
    saved: list[Checkpoint] = []

    for epoch in range(1, epochs + 1):
        lr = torch.tensor([learning_rate(run.learning_rate, epoch, epochs) for run in runs])
        orders = [subset[torch.randperm(len(subset), generator=g)] for subset, g in zip(streams.subsets, streams.generators)]
        steps = [math.ceil(len(order) / batch_size) for order in orders]
        seen = torch.zeros(models)
        correct = torch.zeros(models)
        loss_sum = torch.zeros(models, dtype=torch.float64)
        for step in range(max(steps)):
            active = torch.tensor([step < s for s in steps]) & ~diverged
            index = torch.zeros(models, batch_size, dtype=torch.long)
            weight = torch.zeros(models, batch_size)
            offsets = torch.full((models, batch_size, 2), CROP_PADDING, dtype=torch.long)
            for m, order in enumerate(orders):
                if step < steps[m]:
                    batch = order[step * batch_size : (step + 1) * batch_size]
                    index[m, : len(batch)], weight[m, : len(batch)] = batch, 1.0
                    if crop:
                        offsets[m, : len(batch)] = torch.randint(0, 2 * CROP_PADDING + 1, (len(batch), 2),
                                                                 generator=streams.generators[m])
            inputs = train_x[index]
            if crop:
                inputs = random_crop(inputs, offsets)
            dropout.draw(token_shape)
            logits = batched_logits(spec, packed_views(spec, packed), inputs, positions, dropout, embedding)
            per_sample = F.cross_entropy(logits.transpose(1, 2), train_y[index], reduction="none")
            per_model = (per_sample * weight).sum(-1) / weight.sum(-1).clamp_min(1.0)
            total = torch.where(active, per_model, torch.zeros_like(per_model)).nan_to_num().sum()
            packed.grad = None
            total.backward()
            optimizer.step(lr, active)
            with torch.no_grad():
                diverged |= ~packed.isfinite().all(1) | ~per_model.isfinite()
                counted = active.float()[:, None] * weight
                correct += ((logits.argmax(-1) == train_y[index]).float() * counted).sum(-1)
                loss_sum += (per_sample.detach() * counted).sum(-1).double()
                seen += counted.sum(-1)
            if on_step:
                on_step()
        rows = packed.detach().clone()
        val_acc, val_loss = _evaluate(spec, rows, val_x, val_y, positions, embedding)
        keep = epoch in checkpoint_epochs
        test_acc, test_loss = _evaluate(spec, rows, test_x, test_y, positions, embedding) if keep else (None, None)
        for m, run in enumerate(runs):
            metrics = {"train_accuracy": float(correct[m] / seen[m]) if seen[m] else float("nan"),
                       "train_loss": float(loss_sum[m] / seen[m]) if seen[m] else float("nan"),
                       "validation_accuracy": float(val_acc[m]), "validation_loss": float(val_loss[m])}
            if keep:
                metrics |= {"test_accuracy": float(test_acc[m]), "test_loss": float(test_loss[m])}
            record = Checkpoint(run, epoch, False, rows[m].numpy().copy(), metrics, bool(diverged[m]))
            if keep:
                saved.append(record)
            if not record.diverged and val_acc[m] > best_accuracy[m]:
                best_accuracy[m], best[m] = val_acc[m], record
    chosen = [best[m] or next(c for c in reversed(saved) if c.run is run) for m, run in enumerate(runs)]
    untested = [m for m, c in enumerate(chosen) if "test_accuracy" not in c.metrics]
    if untested:
        rows = torch.from_numpy(np.stack([chosen[m].params for m in untested]))
        test_acc, test_loss = _evaluate(spec, rows, test_x, test_y, positions, embedding)
        for m, acc, loss in zip(untested, test_acc, test_loss):
            chosen[m].metrics |= {"test_accuracy": float(acc), "test_loss": float(loss)}
    saved += [Checkpoint(c.run, c.epoch, True, c.params, c.metrics, c.diverged) for c in chosen]
    for c in saved:
        if c.diverged:
            c.metrics = {k: (float("nan") if "loss" in k else v) for k, v in c.metrics.items()}
    return saved


def train_groups(groups: list[list[Run]], data: TaskData, spec: ArchitectureSpec, epochs: int,
                 checkpoint_epochs: list[int], batch_size: int = BATCH_SIZE, workers: int | None = None,
                 on_step: Callable[[], None] | None = None) -> Iterator[tuple[list[Run], list[Checkpoint], float]]:
    """Train groups `workers` at a time (default: one per core this process may use); yield (group, checkpoints,
    seconds) as each ends.

    Several workers each train their group on one core (one intra-op thread, in threads of this process): at
    these sizes that beats one group whose every kernel is split over all cores (BENCHMARKS.md). A group's
    result does not depend on the groups trained beside it.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    count = max(1, min(workers or cores, len(groups)))

    def train(group: list[Run]) -> tuple[list[Run], list[Checkpoint], float]:
        started = time.perf_counter()
        checkpoints = train_group(group, data, spec, epochs, checkpoint_epochs, batch_size, on_step=on_step)
        return group, checkpoints, time.perf_counter() - started

    threads = torch.get_num_threads()
    torch.set_num_threads(1 if count > 1 else threads)
    pool = ThreadPoolExecutor(count)
    try:
        for future in as_completed([pool.submit(train, group) for group in groups]):
            yield future.result()
    finally:
        pool.shutdown(cancel_futures=True)
        torch.set_num_threads(threads)


def make_torch_optimizer(run: Run, parameters: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """torch.optim's version of a run's optimizer (the plain baseline, and the reference in tests)."""
    kwargs = {"lr": run.learning_rate, "weight_decay": run.l2}
    if run.optimizer == "sgd":
        return torch.optim.SGD(parameters, **kwargs)
    if run.optimizer == "sgd_momentum":
        return torch.optim.SGD(parameters, momentum=0.9, **kwargs)
    if run.optimizer == "adam":
        return torch.optim.Adam(parameters, betas=(0.9, 0.999), **kwargs)
    return torch.optim.RMSprop(parameters, alpha=0.99, **kwargs)


def train_run_plain(run: Run, data: TaskData, spec: ArchitectureSpec, epochs: int, checkpoint_epochs: list[int],
                    batch_size: int = BATCH_SIZE, augment: bool = True
                    ) -> tuple[dict[str, torch.Tensor], dict[int, dict[str, float]]]:
    """One run alone with `ZooTransformer` and torch.optim: the baseline the vectorized trainer is measured and
    tested against. It does the same work as `train_group`: validation accuracy every epoch, test accuracy at the
    checkpoint epochs, and draws from the same random streams (dropout aside: `nn.Dropout` uses the global RNG).
    Returns the final state_dict and the accuracies per epoch."""
    streams = _RunStreams([run], data)
    generator, subset = streams.generators[0], streams.subsets[0]
    model = ZooTransformer(spec, dropout=run.dropout)
    model.load_state_dict(init_params(spec, run.w_init_std, generator))
    if data.embedding is not None:
        model.embedding.table.copy_(torch.from_numpy(data.embedding))
    optimizer = make_torch_optimizer(run, list(model.parameters()))
    train_x, train_y = torch.from_numpy(data.train_x), torch.from_numpy(data.train_y)
    evaluation = {"validation": (torch.from_numpy(data.validation_x), torch.from_numpy(data.validation_y)),
                  "test": (torch.from_numpy(data.test_x), torch.from_numpy(data.test_y))}
    crop = augment and spec.modality == "vision"
    history: dict[int, dict[str, float]] = {}
    for epoch in range(1, epochs + 1):
        model.train()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(run.learning_rate, epoch, epochs)
        order = subset[torch.randperm(len(subset), generator=generator)]
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            inputs = train_x[batch]
            if crop:
                inputs = random_crop(inputs, torch.randint(0, 2 * CROP_PADDING + 1, (len(batch), 2),
                                                           generator=generator))
            loss = F.cross_entropy(model(inputs), train_y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        splits = ["validation", "test"] if epoch in checkpoint_epochs else ["validation"]
        with torch.no_grad():
            history[epoch] = {f"{split}_accuracy": float(torch.cat([model(x) for x in evaluation[split][0].split(250)])
                                                         .argmax(-1).eq(evaluation[split][1]).float().mean())
                              for split in splits}
    return model.state_dict(), history
