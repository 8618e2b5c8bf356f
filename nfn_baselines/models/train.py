"""Training predictors on packed weights: Adam with per-model learning rate and weight decay, linear warm-up then
cosine, mini-batches, model selection on the validation split (Kendall's tau, or accuracy for a class target),
optional early stopping, deterministic by seed, and optional augmentation by random elements of the symmetry group.

Several models of one architecture (seeds, tuning trials) train together as one batched model: their parameters
are stacked and one `torch.func.vmap` call runs every model on its own batch, so a step costs a few large kernels
instead of one small set per model. Each model keeps its own data order, dropout stream, schedule and best epoch;
it trains as it would alone (tests check this to float round-off).

A model reads its input in two steps when it defines them (`prepare`, `forward_prepared`: features computed
without learned parameters, such as statistics, are then computed once per split); any other `nn.Module` with
`forward_logits(TransformerWeights)` trains too.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from small_transformer_zoo.format.architecture import ArchitectureSpec
from small_transformer_zoo.weights.symmetry import sample_group_element
from small_transformer_zoo.weights.weight_space import TransformerWeights

from .metrics import kendall_tau

Loss = Literal["bce", "mse", "ce"]
Inputs = tuple[torch.Tensor, ...]  # a model's prepared inputs (`prepare`), one row per checkpoint
PREDICT_CHUNK = 256


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
    patience: int | None = None  # stop after this many epochs without a better validation score (None: never)


@dataclass
class TrainResult:
    model: nn.Module
    best_epoch: int
    best_validation_score: float
    history: list[dict[str, float]] = field(default_factory=list)
    scale: tuple[float, float] = (0.0, 1.0)  # a squared-error target's training mean and deviation

    @property
    def best_validation_tau(self) -> float:
        return self.best_validation_score


def warmup_cosine(total_steps: int, warmup_steps: int, start_factor: float = 0.1) -> Callable[[int], float]:
    """LR multiplier: linear from `start_factor` to 1 over the warm-up, then cosine towards 0."""
    def factor(step: int) -> float:
        if step < warmup_steps:
            return start_factor + (1 - start_factor) * step / max(1, warmup_steps)
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return factor


class _Prepared(nn.Module):
    """A model seen through its second step: `forward(*prepared inputs)`."""

    def __init__(self, model: nn.Module, spec: ArchitectureSpec) -> None:
        super().__init__()
        self.model, self.spec = model, spec

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        if hasattr(self.model, "forward_prepared"):
            return self.model.forward_prepared(*inputs)
        return self.model.forward_logits(TransformerWeights.from_params(inputs[0], self.spec))


def prepare(model: nn.Module, params: torch.Tensor, progress: Callable[[int], None] | None = None) -> Inputs:
    """A model's first step on packed weights [N, n_params], in chunks (identity for a model without one);
    `progress(rows)` after each chunk (a feature pass can take minutes)."""
    if not hasattr(model, "prepare"):
        return (params,)
    chunks = []
    for i in range(0, len(params), PREDICT_CHUNK):
        chunks.append(model.prepare(params[i : i + PREDICT_CHUNK]))
        if progress:
            progress(len(chunks[-1][0]))
    if not chunks:
        return model.prepare(params)
    return tuple(torch.cat(parts) for parts in zip(*chunks))


def outputs_to_predictions(logits: torch.Tensor, loss: Loss, scale: tuple[float, float]) -> np.ndarray:
    """What a model predicts from its raw outputs: a probability (bce), a value in the target's unit (mse), or
    the class probabilities (ce)."""
    if loss == "bce":
        return torch.sigmoid(logits).numpy()
    if loss == "ce":
        return torch.softmax(logits, -1).numpy()
    return logits.numpy() * scale[1] + scale[0]


@torch.no_grad()
def predict(model: nn.Module, params: torch.Tensor, spec: ArchitectureSpec, loss: Loss = "bce",
            scale: tuple[float, float] = (0.0, 1.0)) -> np.ndarray:
    """Predictions for packed weights [N, n_params]."""
    return predict_prepared(model, prepare(model, params), spec, loss, scale)


@torch.no_grad()
def predict_prepared(model: nn.Module, inputs: tuple[torch.Tensor, ...], spec: ArchitectureSpec, loss: Loss = "bce",
                     scale: tuple[float, float] = (0.0, 1.0)) -> np.ndarray:
    """Predictions from a model's prepared inputs (`prepare`; moved, a chunk at a time, to the model's device), so
    that models of one kind share one preparation of a split."""
    model.eval()
    device = next(model.parameters()).device
    wrapped = _Prepared(model, spec)
    out = [wrapped(*(t[start : start + PREDICT_CHUNK].to(device) for t in inputs)).cpu()
           for start in range(0, len(inputs[0]), PREDICT_CHUNK)]
    if not out:
        return np.empty(0)
    return outputs_to_predictions(torch.cat(out).float(), loss, scale)


def validation_score(predicted: np.ndarray, true: np.ndarray, loss: Loss) -> float:
    """What selects the epoch: Kendall's tau, or accuracy for a class target."""
    if loss == "ce":
        return float(np.mean(predicted.argmax(-1) == true)) if len(true) else math.nan
    return kendall_tau(predicted, true)


def train_predictor(model: nn.Module, spec: ArchitectureSpec, train: tuple[torch.Tensor, torch.Tensor],
                    validation: tuple[torch.Tensor, torch.Tensor], config: TrainConfig,
                    progress: Callable[[dict[str, float]], None] | None = None, loss: Loss = "bce") -> TrainResult:
    """Train `model` (weights -> target); returns it with the parameters of its best validation epoch. Torch's
    global random state is left as it was."""
    return train_predictors([model], spec, train, validation, [config], progress, loss)[0]


def train_predictors(models: Sequence[nn.Module], spec: ArchitectureSpec, train: tuple[torch.Tensor, torch.Tensor],
                     validation: tuple[torch.Tensor, torch.Tensor], configs: Sequence[TrainConfig],
                     progress: Callable[[dict[str, float]], None] | None = None,
                     loss: Loss = "bce", prepared: tuple[Inputs, Inputs] | None = None) -> list[TrainResult]:
    """Train models of one architecture together, model k with `configs[k]` (its own seed, learning rate, weight
    decay, epochs and patience; batch size, augmentation and device shared). `prepared`: the training and
    validation weights already through the models' first step (`prepare`), so that a caller training several
    groups on the same splits prepares them once (with augmentation, the training inputs are prepared per batch
    from the moved weights instead)."""
    if len(models) != len(configs) or not models:
        raise ValueError("train_predictors needs one config per model, and at least one model")
    for name, inputs, (params, _) in zip(("training", "validation"), prepared or (), (train, validation)):
        if not inputs or any(len(t) != len(params) for t in inputs):
            raise ValueError(f"prepared {name} inputs of {[len(t) for t in inputs]} rows for {len(params)} "
                             f"checkpoints")
    shared = {(c.batch_size, c.augment, c.device) for c in configs}
    if len(shared) != 1:
        raise ValueError(f"models trained together share batch size, augmentation and device; got {sorted(shared)}")
    for config in configs:
        if config.epochs < 1 or config.batch_size < 1 or config.lr <= 0 or config.weight_decay < 0:
            raise ValueError(f"bad training config {config}")
    device = torch.device(configs[0].device)
    with torch.random.fork_rng(devices=[device.index or 0] if device.type == "cuda" else []):
        torch.manual_seed(configs[0].seed)
        return _BatchedTraining(list(models), spec, train, validation, list(configs), loss, device,
                                prepared).run(progress)


class _BatchedTraining:
    """The state of K models trained together (`train_predictors`)."""

    def __init__(self, models: list[nn.Module], spec: ArchitectureSpec, train: tuple[torch.Tensor, torch.Tensor],
                 validation: tuple[torch.Tensor, torch.Tensor], configs: list[TrainConfig], loss: Loss,
                 device: torch.device, prepared: tuple[Inputs, Inputs] | None = None) -> None:
        self.models, self.spec, self.configs, self.loss, self.device = models, spec, configs, loss, device
        self.wrapped = [_Prepared(m.to(device), spec) for m in models]
        self.params, self.buffers = stack_module_state(self.wrapped)
        self.base = copy.deepcopy(self.wrapped[0]).to("meta")
        labels = train[1].to(device)
        self.scale = (0.0, 1.0)
        if loss == "mse":
            self.scale = (float(labels.float().mean()), float(labels.float().std().clamp_min(1e-12)))
            labels = (labels.float() - self.scale[0]) / self.scale[1]
        self.train_params, self.train_labels = train[0].to(device), labels
        self.validation_params, self.validation_labels = validation[0].to(device), validation[1].numpy()
        self.augment = configs[0].augment
        moved = None if prepared is None else [tuple(t.to(device) for t in inputs) for inputs in prepared]
        self.inputs = None if self.augment else moved[0] if moved else prepare(models[0], self.train_params)
        self.validation_inputs = moved[1] if moved else prepare(models[0], self.validation_params)
        self.generators = [torch.Generator().manual_seed(c.seed) for c in configs]
        count = len(models)
        self.lr = torch.tensor([c.lr for c in configs], device=device)
        self.weight_decay = torch.tensor([c.weight_decay for c in configs], device=device)
        self.m = {k: torch.zeros_like(v) for k, v in self.params.items()}
        self.v = {k: torch.zeros_like(v) for k, v in self.params.items()}
        self.steps = 0
        self.steps_per_epoch = max(1, math.ceil(len(self.train_params) / configs[0].batch_size))
        self.schedules = [warmup_cosine(c.epochs * self.steps_per_epoch, c.warmup_epochs * self.steps_per_epoch)
                          for c in configs]
        self.best_score = [-math.inf] * count
        self.best_epoch = [-1] * count
        self.best_state = {k: v.detach().clone() for k, v in self.params.items()}
        self.history: list[list[dict[str, float]]] = [[] for _ in range(count)]
        self.active = [True] * count

    def _call(self, params: dict, buffers: dict, *inputs: torch.Tensor) -> torch.Tensor:
        return functional_call(self.base, (params, buffers), inputs)

    def _forward(self, inputs: Sequence[torch.Tensor], batched_inputs: bool) -> torch.Tensor:
        """Outputs [K, N, ...] of every model; `batched_inputs`: inputs [K, N, ...], one batch per model."""
        if len(self.models) == 1:  # no vmap for one model: its dispatch costs more than it saves here
            one = lambda stacked: {name: value[0] for name, value in stacked.items()}  # noqa: E731
            inputs = [t[0] for t in inputs] if batched_inputs else list(inputs)
            return self._call(one(self.params), one(self.buffers), *inputs).unsqueeze(0)
        dims = 0 if batched_inputs else None
        return vmap(self._call, in_dims=(0, 0, *[dims] * len(inputs)), randomness="different")(
            self.params, self.buffers, *inputs)

    def _batch(self, orders: list[torch.Tensor], start: int) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        size = self.configs[0].batch_size
        index = torch.stack([order[start : start + size] for order in orders]).to(self.device)   # [K, B]
        labels = self.train_labels[index]
        if not self.augment:
            return tuple(t[index] for t in self.inputs), labels
        per_model = []
        for k, generator in enumerate(self.generators):
            weights = TransformerWeights.from_params(self.train_params[index[k]].cpu(), self.spec)
            moved = sample_group_element(self.spec, generator).act(weights).to_params().to(self.device)
            per_model.append(prepare(self.models[k], moved))
        return tuple(torch.stack(parts) for parts in zip(*per_model)), labels

    def _loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Per-model mean loss [K]."""
        if self.loss == "bce":
            return nn.functional.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype),
                                                                  reduction="none").mean(-1)
        if self.loss == "ce":
            return nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="none"
                                               ).view(labels.shape).mean(-1)
        return ((logits - labels.to(logits.dtype)) ** 2).mean(-1)

    @torch.no_grad()
    def _adam_step(self) -> None:
        """torch.optim.Adam's update (betas 0.9, 0.999, eps 1e-8, weight decay added to the gradient) with each
        model's own learning rate and schedule; stopped models stay as they are."""
        self.steps += 1
        factors = torch.tensor([s(self.steps - 1) if a else 0.0 for s, a in zip(self.schedules, self.active)],
                               device=self.device)
        rate = self.lr * factors
        bias1, bias2 = 1 - 0.9 ** self.steps, 1 - 0.999 ** self.steps
        for name, param in self.params.items():
            shape = (-1,) + (1,) * (param.ndim - 1)
            grad = param.grad + self.weight_decay.view(shape).to(param.dtype) * param
            self.m[name].lerp_(grad, 0.1)
            self.v[name].mul_(0.999).addcmul_(grad, grad, value=0.001)
            update = (self.m[name] / bias1) / ((self.v[name] / bias2).sqrt() + 1e-8)
            param.sub_(rate.view(shape).to(param.dtype) * update)

    @torch.no_grad()
    def _validation_predictions(self) -> np.ndarray:
        for module in self.base.modules():
            module.eval()
        out = [self._forward([t[i : i + PREDICT_CHUNK] for t in self.validation_inputs], batched_inputs=False)
               for i in range(0, len(self.validation_params), PREDICT_CHUNK)]
        for module in self.base.modules():
            module.train()
        logits = torch.cat(out, dim=1).float().cpu()
        return np.stack([outputs_to_predictions(logits[k], self.loss, self.scale) for k in range(len(self.models))])

    def run(self, progress: Callable[[dict[str, float]], None] | None) -> list[TrainResult]:
        size = self.configs[0].batch_size
        for epoch in range(1, max(c.epochs for c in self.configs) + 1):
            for module in self.base.modules():
                module.train()
            orders = [torch.randperm(len(self.train_params), generator=g) for g in self.generators]
            total = torch.zeros(len(self.models), device=self.device)
            for start in range(0, len(self.train_params), size):
                inputs, labels = self._batch(orders, start)
                per_model = self._loss(self._forward(inputs, batched_inputs=True), labels)
                for tensor in self.params.values():
                    tensor.grad = None
                per_model.sum().backward()
                self._adam_step()
                total += per_model.detach() * labels.shape[1]
            scores = [validation_score(p, self.validation_labels, self.loss) for p in self._validation_predictions()]
            self._select(epoch, scores, (total / len(self.train_params)).tolist(), progress)
            if not any(self.active):
                break
        return self._results()

    def _select(self, epoch: int, scores: list[float], losses: list[float],
                progress: Callable[[dict[str, float]], None] | None) -> None:
        for k, config in enumerate(self.configs):
            if not self.active[k]:
                continue
            record = {"epoch": epoch, "train_loss": losses[k], "validation_score": scores[k],
                      "validation_tau": scores[k]}
            self.history[k].append(record)
            if progress:
                progress(record)
            if scores[k] > self.best_score[k] or self.best_epoch[k] < 0:
                self.best_score[k], self.best_epoch[k] = scores[k], epoch
                for name, value in self.params.items():
                    self.best_state[name][k] = value.detach()[k]
            stalled = config.patience is not None and epoch - self.best_epoch[k] >= config.patience
            self.active[k] = epoch < config.epochs and not stalled

    def _results(self) -> list[TrainResult]:
        out = []
        for k, model in enumerate(self.models):
            state = {name[len("model."):]: value[k].clone()
                     for name, value in {**self.buffers, **self.best_state}.items()}
            best = copy.deepcopy(model)
            best.load_state_dict(state)
            out.append(TrainResult(best, self.best_epoch[k], self.best_score[k], self.history[k], self.scale))
        return out
