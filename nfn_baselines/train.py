"""Training an accuracy predictor on packed weights: binary cross-entropy against accuracy, Adam, linear warm-up
then cosine, mini-batches, model selection on validation Kendall's tau, deterministic by seed, and optional
augmentation by random elements of the symmetry group."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from small_transformer_zoo.format.architecture import ArchitectureSpec
from small_transformer_zoo.weights.symmetry import sample_group_element
from small_transformer_zoo.weights.weight_space import TransformerWeights

from .metrics import kendall_tau


@dataclass
class TrainConfig:
    epochs: int = 50
    batch_size: int = 16
    lr: float = 1e-3
    warmup_epochs: int = 10
    weight_decay: float = 0.0
    seed: int = 0
    augment: bool = False
    device: str = "cpu"          # where the predictor and its batches live


@dataclass
class TrainResult:
    model: nn.Module
    best_epoch: int
    best_validation_tau: float
    history: list[dict[str, float]] = field(default_factory=list)


def warmup_cosine(total_steps: int, warmup_steps: int, start_factor: float = 0.1) -> Callable[[int], float]:
    """LR multiplier: linear from `start_factor` to 1 over the warm-up, then cosine towards 0."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return start_factor + (1 - start_factor) * step / max(1, warmup_steps)
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return factor


@torch.no_grad()
def predict(model: nn.Module, params: torch.Tensor, spec: ArchitectureSpec, batch_size: int = 256) -> np.ndarray:
    """Predicted accuracies for packed weights [N, n_params] (moved, a batch at a time, to the model's device)."""
    model.eval()
    device = next(model.parameters()).device
    out = [model(TransformerWeights.from_params(params[i : i + batch_size].to(device), spec))
           for i in range(0, len(params), batch_size)]
    return torch.cat(out).cpu().numpy() if out else np.empty(0)


def train_predictor(model: nn.Module, spec: ArchitectureSpec, train: tuple[torch.Tensor, torch.Tensor],
                    validation: tuple[torch.Tensor, torch.Tensor], config: TrainConfig,
                    progress: Callable[[dict[str, float]], None] | None = None) -> TrainResult:
    """Train `model` (weights -> accuracy in (0, 1)); returns it with the parameters of its best validation epoch.
    Torch's global random state (dropout) is seeded from `config.seed` inside and put back afterwards."""
    device = torch.device(config.device)
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        torch.manual_seed(config.seed)
        return _train_epochs(model, spec, train, validation, config, progress)


def _train_epochs(model: nn.Module, spec: ArchitectureSpec, train: tuple[torch.Tensor, torch.Tensor],
                  validation: tuple[torch.Tensor, torch.Tensor], config: TrainConfig,
                  progress: Callable[[dict[str, float]], None] | None) -> TrainResult:
    generator = torch.Generator().manual_seed(config.seed)
    device = torch.device(config.device)
    model.to(device)
    params, labels = train[0].to(device), train[1].to(device)
    steps_per_epoch = max(1, math.ceil(len(params) / config.batch_size))
    optimizer = torch.optim.Adam(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, warmup_cosine(config.epochs * steps_per_epoch, config.warmup_epochs * steps_per_epoch))
    loss_fn = nn.BCEWithLogitsLoss()
    best = TrainResult(copy.deepcopy(model), -1, -math.inf)
    for epoch in range(1, config.epochs + 1):
        model.train()
        order = torch.randperm(len(params), generator=generator).to(device)
        total = torch.zeros((), device=device)
        for start in range(0, len(params), config.batch_size):
            index = order[start : start + config.batch_size]
            weights = TransformerWeights.from_params(params[index], spec)
            if config.augment:
                weights = sample_group_element(spec, generator).act(weights.to("cpu")).to(device)
            logits = model.forward_logits(weights)
            loss = loss_fn(logits, labels[index].to(logits.dtype))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            total += loss.detach() * len(index)
        tau = kendall_tau(predict(model, validation[0], spec), validation[1].numpy())
        record = {"epoch": epoch, "train_loss": float(total) / len(params), "validation_tau": tau}
        best.history.append(record)
        if progress:
            progress(record)
        if tau > best.best_validation_tau or best.best_epoch < 0:
            best.model, best.best_epoch, best.best_validation_tau = copy.deepcopy(model), epoch, tau
    return best
