"""Training a group of runs together (the vectorized trainer) and one run alone (the plain PyTorch baseline).

Each run draws every random number (initialisation, its training subset, batch order, crop offsets, dropout) from
its own generator, seeded by its run id, so a run's result does not depend on which runs share its group.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch.nn import functional as F

from small_transformer_zoo.architecture import ArchitectureSpec
from small_transformer_zoo.model import ZooTransformer, sinusoidal_positions

from .batched import VectorizedOptimizer, batched_logits
from .data import TaskData
from .grid import Run

BATCH_SIZE = 128
CROP_PADDING = 2
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
    padded = F.pad(images, (p, p, p, p))
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


def _evaluate(spec: ArchitectureSpec, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
              positions: torch.Tensor, embedding: torch.Tensor | None, chunk: int = 250) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy and mean cross-entropy of every model on the same inputs."""
    models = next(iter(params.values())).shape[0]
    correct = torch.zeros(models)
    loss = torch.zeros(models, dtype=torch.float64)
    with torch.no_grad():
        for start in range(0, len(y), chunk):
            xs, ys = x[start : start + chunk], y[start : start + chunk]
            logits = batched_logits(spec, params, xs.expand(models, *xs.shape), positions, None, embedding)
            correct += (logits.argmax(-1) == ys).sum(-1)
            loss += F.cross_entropy(logits.transpose(1, 2), ys.expand(models, -1), reduction="none").sum(-1).double()
    return (correct / len(y)).numpy(), (loss / len(y)).numpy()


def _pack(spec: ArchitectureSpec, params: dict[str, torch.Tensor]) -> np.ndarray:
    return torch.cat([params[p.name].detach().reshape(params[p.name].shape[0], -1) for p in spec.parameters()],
                     dim=1).numpy().copy()


def train_group(runs: list[Run], data: TaskData, spec: ArchitectureSpec, epochs: int, checkpoint_epochs: list[int],
                augment: bool = True, on_step: Callable[[], None] | None = None) -> list[Checkpoint]:
    """Train runs that share an optimizer in lockstep; return their checkpoints (epochs listed, and the best)."""
    optimizers = {run.optimizer for run in runs}
    if len(optimizers) != 1:
        raise ValueError(f"a group must share one optimizer, got {sorted(optimizers)}")
    models = len(runs)
    streams = _RunStreams(runs, data)
    inits = [init_params(spec, run.w_init_std, g) for run, g in zip(runs, streams.generators)]
    params = {name: torch.stack([init[name] for init in inits]).requires_grad_() for name in inits[0]}
    optimizer = VectorizedOptimizer(runs[0].optimizer, list(params.values()),
                                    torch.tensor([run.l2 for run in runs]))
    dropout_p = [run.dropout for run in runs]
    positions = sinusoidal_positions(spec.num_tokens, spec.d_model)
    embedding = None if data.embedding is None else torch.from_numpy(data.embedding)
    train_x, train_y = torch.from_numpy(data.train_x), torch.from_numpy(data.train_y)
    val_x, val_y = torch.from_numpy(data.validation_x), torch.from_numpy(data.validation_y)
    test_x, test_y = torch.from_numpy(data.test_x), torch.from_numpy(data.test_y)
    crop = augment and spec.modality == "vision"
    diverged = torch.zeros(models, dtype=torch.bool)
    best_accuracy = np.full(models, -1.0)
    best: list[Checkpoint | None] = [None] * models
    saved: list[Checkpoint] = []

    rates = torch.tensor(dropout_p)
    keep_scale = 1.0 / (1.0 - rates)
    use_dropout = bool((rates > 0).any())

    def dropout(x: torch.Tensor, site: int) -> torch.Tensor:
        """Inverted dropout with each model's own rate and generator (one uniform draw per model and site)."""
        if not use_dropout:
            return x
        mask = torch.empty_like(x)
        for m, (p, generator) in enumerate(zip(dropout_p, streams.generators)):
            if p > 0:
                mask[m].uniform_(generator=generator)
            else:
                mask[m].fill_(1.0)
        shape = (-1,) + (1,) * (x.ndim - 1)
        mask = mask.ge_(rates.view(shape)).mul_(keep_scale.view(shape))  # 1/(1-p) where kept, 0 where dropped
        return x * mask

    for epoch in range(1, epochs + 1):
        lr = torch.tensor([learning_rate(run.learning_rate, epoch, epochs) for run in runs])
        orders = [subset[torch.randperm(len(subset), generator=g)] for subset, g in zip(streams.subsets, streams.generators)]
        steps = [math.ceil(len(order) / BATCH_SIZE) for order in orders]
        seen = torch.zeros(models)
        correct = torch.zeros(models)
        loss_sum = torch.zeros(models, dtype=torch.float64)
        for step in range(max(steps)):
            active = torch.tensor([step < s for s in steps]) & ~diverged
            index = torch.zeros(models, BATCH_SIZE, dtype=torch.long)
            weight = torch.zeros(models, BATCH_SIZE)
            offsets = torch.full((models, BATCH_SIZE, 2), CROP_PADDING, dtype=torch.long)
            for m, order in enumerate(orders):
                if step < steps[m]:
                    batch = order[step * BATCH_SIZE : (step + 1) * BATCH_SIZE]
                    index[m, : len(batch)], weight[m, : len(batch)] = batch, 1.0
                    if crop:
                        offsets[m, : len(batch)] = torch.randint(0, 2 * CROP_PADDING + 1, (len(batch), 2),
                                                                 generator=streams.generators[m])
            inputs = train_x[index]
            if crop:
                inputs = random_crop(inputs, offsets)
            logits = batched_logits(spec, params, inputs, positions, dropout, embedding)
            per_sample = F.cross_entropy(logits.transpose(1, 2), train_y[index], reduction="none")
            per_model = (per_sample * weight).sum(-1) / weight.sum(-1).clamp_min(1.0)
            total = torch.where(active, per_model, torch.zeros_like(per_model)).nan_to_num().sum()
            for p in params.values():
                p.grad = None
            total.backward()
            optimizer.step(lr, active)
            with torch.no_grad():
                finite = torch.stack([p.reshape(models, -1).isfinite().all(1) for p in params.values()]).all(0)
                diverged |= ~finite | ~per_model.isfinite()
                counted = active.float()[:, None] * weight
                correct += ((logits.argmax(-1) == train_y[index]).float() * counted).sum(-1)
                loss_sum += (per_sample.detach() * counted).sum(-1).double()
                seen += counted.sum(-1)
            if on_step:
                on_step()
        val_acc, val_loss = _evaluate(spec, params, val_x, val_y, positions, embedding)
        test_acc, test_loss = _evaluate(spec, params, test_x, test_y, positions, embedding)
        packed = _pack(spec, params)
        for m, run in enumerate(runs):
            bad = bool(diverged[m])
            metrics = {"train_accuracy": float(correct[m] / seen[m]) if seen[m] else float("nan"),
                       "train_loss": float(loss_sum[m] / seen[m]) if seen[m] else float("nan"),
                       "validation_accuracy": float(val_acc[m]), "validation_loss": float(val_loss[m]),
                       "test_accuracy": float(test_acc[m]), "test_loss": float(test_loss[m])}
            if bad:
                metrics = {k: (float("nan") if "loss" in k else v) for k, v in metrics.items()}
            record = Checkpoint(run, epoch, False, packed[m], metrics, bad)
            if epoch in checkpoint_epochs:
                saved.append(record)
            if not bad and val_acc[m] > best_accuracy[m]:
                best_accuracy[m], best[m] = val_acc[m], record
    for m, run in enumerate(runs):
        chosen = best[m] or next(c for c in reversed(saved) if c.run is run)
        saved.append(Checkpoint(run, chosen.epoch, True, chosen.params, chosen.metrics, chosen.diverged))
    return saved


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


def train_run_plain(run: Run, data: TaskData, spec: ArchitectureSpec, epochs: int, augment: bool = True,
                    max_steps: int | None = None) -> dict[str, torch.Tensor]:
    """One run alone with `ZooTransformer` and torch.optim: the baseline the vectorized trainer is measured and
    tested against. Same random streams as `train_group` (dropout aside: nn.Dropout uses the global RNG)."""
    streams = _RunStreams([run], data)
    generator, subset = streams.generators[0], streams.subsets[0]
    model = ZooTransformer(spec, dropout=run.dropout)
    model.load_state_dict(init_params(spec, run.w_init_std, generator))
    if data.embedding is not None:
        model.embedding.table.copy_(torch.from_numpy(data.embedding))
    optimizer = make_torch_optimizer(run, list(model.parameters()))
    train_x, train_y = torch.from_numpy(data.train_x), torch.from_numpy(data.train_y)
    crop = augment and spec.modality == "vision"
    done = 0
    model.train()
    for epoch in range(1, epochs + 1):
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(run.learning_rate, epoch, epochs)
        order = subset[torch.randperm(len(subset), generator=generator)]
        for start in range(0, len(order), BATCH_SIZE):
            batch = order[start : start + BATCH_SIZE]
            inputs = train_x[batch]
            if crop:
                inputs = random_crop(inputs, torch.randint(0, 2 * CROP_PADDING + 1, (len(batch), 2),
                                                           generator=generator))
            loss = F.cross_entropy(model(inputs), train_y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            done += 1
            if max_steps is not None and done >= max_steps:
                return model.state_dict()
    return model.state_dict()
