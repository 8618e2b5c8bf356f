"""The builder against the authors' training recipe (docs/design.md section 3, the fidelity table): their
initialisation bit for bit, their schedule as torch's schedulers compute it, full batches only, and a data stream
that dropout never touches, on the CPU's masks and on the hashed ones."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torch import nn

from builders.grid import PAPER_GRID, Run, run_seed
from builders.trainer import (RECIPE_VERSION, GroupTraining, RunStreams, init_params, learning_rate,
                              steps_per_epoch, warmup_epochs)
from small_transformer_zoo.format.architecture import ArchitectureSpec, mnist_spec, text_spec
from tests.helpers import recipe

GRID_STDS = sorted({std for family in PAPER_GRID.values() for std in family["w_init_std"]})


def authors_layers(spec: ArchitectureSpec) -> list[nn.Module]:
    """The layers the authors' model constructs, in its module order, as plain torch modules: the patch
    convolution (vision only: the text model loads its word table), per block the four attention projections
    without bias and the MLP, then the classifier."""
    d = spec.d_model
    layers: list[nn.Module] = []
    if spec.modality == "vision":
        layers.append(nn.Conv2d(spec.in_channels, d, spec.patch_size, stride=spec.patch_size))
    for _ in range(spec.num_blocks):
        inner = spec.num_heads * spec.d_head
        layers += [nn.Linear(d, inner, bias=False) for _ in range(3)] + [nn.Linear(inner, d, bias=False)]
        layers += [nn.Linear(d, spec.d_mlp), nn.Linear(spec.d_mlp, d)]
    layers += [nn.Linear(d, d), nn.Linear(d, spec.num_classes)]
    return layers


def authors_initial_weights(spec: ArchitectureSpec, std: float, seed: int) -> list[torch.Tensor]:
    """What the authors' recipe does: seed torch, construct the model (each layer draws its default
    initialisation), then re-initialise every convolution and linear layer with `trunc_normal_(mean=0, std=std)`
    at torch's default bounds and zero its bias."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        layers = authors_layers(spec)
        for layer in layers:
            nn.init.trunc_normal_(layer.weight, mean=0.0, std=std)
            if layer.bias is not None:
                nn.init.constant_(layer.bias, 0)
    return [t.detach() for layer in layers for t in (layer.weight, layer.bias) if t is not None]


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), std=st.sampled_from(GRID_STDS), text=st.booleans())
def test_the_initialisation_is_the_authors_bit_for_bit(seed: int, std: float, text: bool) -> None:
    spec = text_spec(vocab_size=50, max_length=12) if text else mnist_spec()
    mine = init_params(spec, std, torch.Generator().manual_seed(seed))
    theirs = authors_initial_weights(spec, std, seed)
    assert [tuple(t.shape) for t in theirs] == [tuple(p.shape) for p in spec.parameters()]
    for (name, tensor), expected in zip(mine.items(), theirs):
        assert torch.equal(tensor, expected), name


@pytest.mark.parametrize("std", GRID_STDS)
def test_the_realised_init_std_is_the_nominal_one(std: float) -> None:
    """Bounds of +-2 in absolute units cut almost nothing at the grid's stds (a cut at 2 std realises 0.88 std)."""
    spec = mnist_spec()
    weights = torch.cat([tensor.reshape(-1) for seed in range(12)
                         for name, tensor in init_params(spec, std, torch.Generator().manual_seed(seed)).items()
                         if not name.endswith(".bias")])
    assert weights.numel() > 200_000
    assert abs(float(weights.std()) / std - 1) < 0.02, float(weights.std())
    assert float(weights.abs().max()) <= 2.0


@pytest.mark.parametrize("epochs", [100, 20, 16, 8, 6, 2])
def test_the_schedule_is_torchs_linear_warmup_then_cosine(epochs: int) -> None:
    """The authors' schedulers, stepped as they step them: `LinearLR` during the warm-up epochs, then
    `CosineAnnealingLR`, both built on one optimizer before training."""
    base, warmup = 0.05, warmup_epochs(epochs)
    weight = torch.zeros(1, requires_grad=True)
    optimizer = torch.optim.SGD([weight], lr=base)
    linear = torch.optim.lr_scheduler.LinearLR(optimizer, start_factor=1 / warmup, end_factor=1.0,
                                               total_iters=warmup - 1)
    cosine = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=epochs - warmup, eta_min=1e-5)
    for epoch in range(epochs):
        assert learning_rate(base, epoch + 1, epochs) == pytest.approx(optimizer.param_groups[0]["lr"], rel=1e-9)
        weight.grad = torch.zeros(1)
        optimizer.step()
        (linear if epoch < warmup else cosine).step()
    assert warmup == (10 if epochs == 100 else max(1, round(epochs / 10)))


@pytest.mark.parametrize("samples,batch,steps", [(100, 16, 6), (96, 16, 6), (2520, 16, 157), (10, 16, 1)])
def test_an_epoch_trains_full_batches_only(samples: int, batch: int, steps: int) -> None:
    """The authors' loader drops the last partial batch (`drop_last=True`); fewer samples than a batch train as
    one batch."""
    assert steps_per_epoch(samples, batch) == steps
    run = Run("b-0", "adam", 1.0, 0.0, 1e-3, 0.1, 0.0, run_seed("b-0"))
    draws = RunStreams([run], mnist_spec(), samples).epoch(batch, crop=True, dropout_seeds=False)
    used = min(samples, steps * batch)
    assert int(draws.max_steps) == steps and float(draws.weight.sum()) == used
    assert len(set(draws.order[0, :used].tolist())) == used, "no sample twice in an epoch"


def _epoch_orders(runs: list[Run], data, hashed: bool) -> list[torch.Tensor]:
    """The sample order and crop offsets of every epoch of a two-epoch group training, as the trainer drew them."""
    training = GroupTraining(runs, data, mnist_spec(), recipe(3, [3], batch_size=32), "cpu", None, hashed)
    recorded, draw = [], training.streams.epoch

    def recording(*args, **kwargs):
        draws = draw(*args, **kwargs)
        recorded.append(torch.cat([draws.order, draws.offsets.flatten(1)], 1))
        return draws

    training.streams.epoch = recording
    training.run()
    return recorded


@pytest.mark.parametrize("hashed", [False, True], ids=["cpu-masks", "hashed-masks"])
def test_dropout_never_moves_the_data_stream(small_data, hashed: bool) -> None:
    """Two runs with one data seed, one with dropout and one without, see the same batches and crops in every
    epoch, whichever way the masks are drawn."""
    runs = [Run(f"s-{p}", "adam", 0.8, p, 1e-3, 0.2, 1e-6, seed=7, data_seed=11, dropout_seed=13 + i)
            for i, p in enumerate((0.0, 0.2))]
    orders = _epoch_orders(runs, small_data, hashed)
    assert len(orders) == 3
    for epoch in orders:
        assert torch.equal(epoch[0], epoch[1])
    assert not torch.equal(orders[0][0], orders[1][0]), "each epoch its own order"


def test_the_recipe_version_is_recorded() -> None:
    from builders.plan import BuildPlan

    assert RECIPE_VERSION == 2 and BuildPlan.__dataclass_fields__["recipe_version"].default == RECIPE_VERSION
    assert math.isclose(learning_rate(1.0, 10, 100), 1.0), "epoch 10 of 100 trains at the base rate"


@pytest.mark.parametrize("hashed", [False, True], ids=["cpu-masks", "hashed-masks"])
def test_a_run_with_fewer_steps_trains_the_same_alone_and_beside_a_longer_one(small_data, hashed: bool) -> None:
    """A run of a smaller train fraction takes fewer steps than its group's longest run; it draws no masks in the
    steps it sits out, so its weights are the same bits alone or in the group."""
    from builders.trainer import train_group

    runs = [Run(f"f-{fraction}", "adam", fraction, 0.1, 1e-3, 0.2, 1e-6, run_seed(f"f{fraction}"))
            for fraction in (1.0, 0.7)]
    training = recipe(2, [2], batch_size=32)
    together = train_group(runs, small_data, mnist_spec(), training, hashed_dropout=hashed)
    alone = train_group(runs[1:], small_data, mnist_spec(), training, hashed_dropout=hashed)
    mine = [c for c in together if c.run is runs[1]]
    assert len(mine) == len(alone) == 2
    for a, b in zip(mine, alone):
        assert a.epoch == b.epoch and (a.params == b.params).all()
