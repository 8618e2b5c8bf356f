"""The symmetry group, checked on real (briefly trained) checkpoints of both architectures in float64."""

import functools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from small_transformer_zoo.format.architecture import ArchitectureSpec, mnist_spec
from small_transformer_zoo.weights.model import ZooTransformer
from small_transformer_zoo.weights.symmetry import (random_invertible, randomize_params, sample_group_element,
                                                    sample_interface_element)
from small_transformer_zoo.weights.weight_space import TransformerWeights
from tests.helpers import TEXT, briefly_trained, build_zoo, random_inputs, transformed_copy

@pytest.mark.parametrize("spec", [mnist_spec(), TEXT], ids=["vision", "text"])
def test_group_action_keeps_the_logits(spec: ArchitectureSpec) -> None:
    model = briefly_trained(spec)
    x = random_inputs(spec, 16, torch.Generator().manual_seed(99))
    with torch.no_grad():
        reference = model(x)
        for seed in range(3):
            g = sample_group_element(spec, torch.Generator().manual_seed(seed), condition_number=10.0)
            state = g.act_on_state_dict(model.state_dict(), spec)
            moved = max((state[k] - v).abs().max().item() for k, v in model.state_dict().items())
            assert moved > 1e-3, "the group element must actually change the weights"
            logits = transformed_copy(model, state)(x)
            assert (logits - reference).abs().max().item() <= 1e-9


@pytest.mark.parametrize("spec", [mnist_spec(), TEXT], ids=["vision", "text"])
def test_a_transformation_outside_the_group_changes_the_logits(spec: ArchitectureSpec) -> None:
    """Permuting the block input dimension (rows of W_q, W_k, W_v) is not a symmetry: logits move."""
    model = briefly_trained(spec)
    x = random_inputs(spec, 16, torch.Generator().manual_seed(5))
    perm = torch.randperm(spec.d_model, generator=torch.Generator().manual_seed(1))
    weights = TransformerWeights.from_state_dict(model.state_dict(), spec)
    block = weights.blocks[0]
    block.W_q, block.W_k, block.W_v = (t.index_select(-2, perm) for t in (block.W_q, block.W_k, block.W_v))
    with torch.no_grad():
        difference = (transformed_copy(model, weights.state_dict(0))(x) - model(x)).abs().max().item()
    assert difference > 1e-3


@settings(max_examples=25, deadline=None)
@given(count=st.integers(1, 3), size=st.integers(1, 8), kappa=st.floats(1.0, 100.0), seed=st.integers(0, 10**6))
def test_random_invertible_has_the_asked_condition_number(count: int, size: int, kappa: float, seed: int) -> None:
    m = random_invertible(count, size, kappa, torch.Generator().manual_seed(seed))
    assert torch.linalg.cond(m).max().item() <= kappa * (1 + 1e-9)


def test_group_acts_on_multi_channel_batches() -> None:
    """One element acts the same on every channel; QK products only get their heads permuted."""
    spec = ArchitectureSpec("vision", 10, num_heads=3, d_head=4, d_mlp=5, num_blocks=3, d_model=8, image_size=8)
    weights = TransformerWeights.from_params(torch.randn(2, spec.n_params, dtype=torch.float64), spec)
    two_channels = weights.map(lambda t: torch.cat([t, 2 * t], dim=1) if t.ndim > 2 and t.shape[1] == 1 else t)
    g = sample_group_element(spec, torch.Generator().manual_seed(3))
    single, double = g.act(weights), g.act(two_channels)
    double.validate()
    for b, (one, two) in enumerate(zip(single.blocks, double.blocks)):
        for name, tensor in one.as_dict().items():
            pair = two.as_dict()[name]
            assert torch.allclose(pair[:, :1], tensor) and torch.allclose(pair[:, 1:], 2 * tensor)
        before = weights.blocks[b]
        qk_before = before.W_q @ before.W_k.transpose(-1, -2)
        assert torch.allclose(one.W_q @ one.W_k.transpose(-1, -2), qk_before[:, :, g.blocks[b].sigma], atol=1e-10)


def test_group_action_keeps_the_logits_of_tiny_zoo_checkpoints(tmp_path) -> None:
    """The same check on checkpoints that the builders trained (the `tiny` MNIST zoo), in float64."""
    from small_transformer_zoo import Zoo

    build_zoo("mnist", "tiny", tmp_path, progress=False, log=lambda *_: None)
    zoo = Zoo.open(tmp_path, "mnist-tiny")
    weights, rows = zoo.weight_space("train", best_only=True)
    x = random_inputs(zoo.spec, 8, torch.Generator().manual_seed(4))
    weights = weights.to(torch.float64)
    for index in range(min(3, weights.batch_size)):
        model = ZooTransformer(zoo.spec).double().eval()
        model.load_state_dict(weights.state_dict(index))
        g = sample_group_element(zoo.spec, torch.Generator().manual_seed(index), condition_number=10.0)
        with torch.no_grad():
            moved = transformed_copy(model, g.act_on_state_dict(model.state_dict(), zoo.spec))(x)
            assert (moved - model(x)).abs().max().item() <= 1e-9


@pytest.mark.parametrize("spec", [mnist_spec(), TEXT], ids=["vision", "text"])
def test_interface_permutations_keep_the_logits(spec: ArchitectureSpec) -> None:
    """Permuting the features between blocks and before the classifier, outside the paper's group, is exact."""
    model = briefly_trained(spec)
    x = random_inputs(spec, 16, torch.Generator().manual_seed(7))
    with torch.no_grad():
        reference = model(x)
        for seed in range(3):
            g = sample_interface_element(spec, torch.Generator().manual_seed(seed))
            state = g.act_on_state_dict(model.state_dict(), spec)
            moved = max((state[k] - v).abs().max().item() for k, v in model.state_dict().items())
            assert moved > 1e-3
            assert (transformed_copy(model, state)(x) - reference).abs().max().item() <= 1e-9


def test_interface_permutation_of_one_side_only_changes_the_logits() -> None:
    """Both sides of an interface must move: permuting only block 0's outputs is no symmetry."""
    spec = mnist_spec()
    model = briefly_trained(spec)
    x = random_inputs(spec, 16, torch.Generator().manual_seed(8))
    weights = TransformerWeights.from_state_dict(model.state_dict(), spec)
    perm = torch.randperm(spec.d_model, generator=torch.Generator().manual_seed(2))
    block = weights.blocks[0]
    block.W_B, block.b_B = block.W_B.index_select(-1, perm), block.b_B.index_select(-1, perm)
    with torch.no_grad():
        assert (transformed_copy(model, weights.state_dict(0))(x) - model(x)).abs().max().item() > 1e-3


@functools.lru_cache(maxsize=1)
def two_trained_models() -> tuple[ZooTransformer, ZooTransformer]:
    return briefly_trained(mnist_spec(), seed=0, steps=5), briefly_trained(mnist_spec(), seed=1, steps=5)


@settings(max_examples=6, deadline=None)
@given(group=st.sampled_from(["paper-group", "interfaces", "all"]), seed=st.integers(0, 1000))
def test_randomized_checkpoints_compute_the_same_function(group: str, seed: int) -> None:
    spec = mnist_spec()
    models = two_trained_models()
    params = torch.stack([TransformerWeights.from_state_dict(m.state_dict(), spec).to_params()[0] for m in models])
    moved = randomize_params(params, spec, group, ["a", "b"], seed)
    again = randomize_params(params[1:], spec, group, ["b"], seed)
    assert torch.equal(moved[1:], again), "a row's element depends on its key, not on the rows beside it"
    assert (moved - params).abs().max() > 1e-3
    x = random_inputs(spec, 8, torch.Generator().manual_seed(seed))
    with torch.no_grad():
        for row, model in zip(moved, models):
            state = TransformerWeights.from_params(row[None], spec).state_dict(0)
            assert (transformed_copy(model, state)(x) - model(x)).abs().max().item() <= 1e-9
    if group == "interfaces":  # a permutation: the weights' norms and sorted values are kept
        assert torch.allclose(moved.norm(dim=1), params.norm(dim=1))
        assert torch.equal(moved.sort(dim=1).values, params.sort(dim=1).values)
