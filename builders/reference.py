"""The plain trainer: one run alone with `ZooTransformer` and torch.optim, the reference the vectorized trainer
(`builders.trainer`) is checked against in the tests and the baseline `benchmarks/bench_builders.py` measures it
against. Like `nfn_baselines.reference` for the NFN layer, it is written for clarity, not speed; no build uses it.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from small_transformer_zoo.format.architecture import ArchitectureSpec
from small_transformer_zoo.weights.model import ZooTransformer

from .data import TaskData
from .grid import Run
from .trainer import BATCH_SIZE, RunStreams, learning_rate, random_crop


def make_torch_optimizer(run: Run, parameters: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """torch.optim's version of a run's optimizer."""
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
    checkpoint epochs, and draws from the same random streams (dropout aside: `nn.Dropout` uses torch's global
    generator).
    Returns the final state_dict and the accuracies per epoch."""
    streams = RunStreams([run], spec, len(data.train_y))
    model = ZooTransformer(spec, dropout=run.dropout)
    model.load_state_dict({p.name: streams.initial[0, p.offset : p.offset + p.numel].view(p.shape)
                           for p in spec.parameters()})
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
        draws = streams.epoch(batch_size, crop, dropout_seeds=False)
        count = int(draws.steps[0]) * batch_size
        for start in range(0, count, batch_size):
            batch = draws.order[0, start : start + batch_size][draws.weight[0, start : start + batch_size] > 0]
            inputs = train_x[batch]
            if crop:
                inputs = random_crop(inputs, draws.offsets[0, start : start + len(batch)])
            loss = F.cross_entropy(model(inputs), train_y[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        splits = ["validation", "test"] if epoch in checkpoint_epochs else ["validation"]
        with torch.no_grad():
            history[epoch] = {f"{split}_accuracy": int(torch.cat([model(x) for x in evaluation[split][0].split(250)])
                                                       .argmax(-1).eq(evaluation[split][1]).sum()) / len(evaluation[split][1])
                              for split in splits}
    return model.state_dict(), history
