"""The canonical form: one representative per orbit of the symmetry group, computing the same function."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from small_transformer_zoo.format.architecture import ArchitectureSpec, mnist_spec
from small_transformer_zoo.weights.canonical import (canonicalize, canonicalize_interfaces,
                                                   canonicalize_interfaces_params, canonicalize_params)
from small_transformer_zoo.weights.symmetry import sample_group_element, sample_interface_element
from small_transformer_zoo.weights.weight_space import TransformerWeights
from tests.helpers import TEXT, briefly_trained, random_inputs, transformed_copy

SPECS = [mnist_spec(), TEXT]


def _weights(spec: ArchitectureSpec, seed: int, count: int = 2) -> TransformerWeights:
    generator = torch.Generator().manual_seed(seed)
    return TransformerWeights.from_params(torch.randn(count, spec.n_params, generator=generator,
                                                      dtype=torch.float64) * 0.3, spec)


def _distance(a: TransformerWeights, b: TransformerWeights) -> float:
    return (a.to_params() - b.to_params()).abs().max().item()


@settings(max_examples=15, deadline=None)
@given(spec_index=st.integers(0, 1), weight_seed=st.integers(0, 10_000), group_seed=st.integers(0, 10_000),
       condition=st.floats(1.0, 20.0))
def test_the_canonical_form_of_a_moved_checkpoint_is_its_own(spec_index: int, weight_seed: int, group_seed: int,
                                                             condition: float) -> None:
    spec = SPECS[spec_index]
    weights = _weights(spec, weight_seed)
    moved = sample_group_element(spec, torch.Generator().manual_seed(group_seed), condition).act(weights)
    assert _distance(moved, weights) > 1e-3, "the group element must actually move the weights"
    assert _distance(canonicalize(moved), canonicalize(weights)) < 1e-8


def test_canonical_form_is_a_fixed_point_and_keeps_dtype() -> None:
    weights = _weights(mnist_spec(), 3)
    once = canonicalize(weights)
    assert _distance(canonicalize(once), once) < 1e-10 and _distance(once, weights) > 1e-2
    single = weights.to(torch.float32)
    assert canonicalize(single).blocks[0].W_q.dtype == torch.float32
    packed = canonicalize_params(single.to_params(), mnist_spec())
    assert packed.dtype == torch.float32 and packed.shape == single.to_params().shape


@pytest.mark.parametrize("spec", SPECS, ids=["vision", "text"])
def test_the_canonical_checkpoint_computes_the_same_logits(spec: ArchitectureSpec) -> None:
    model = briefly_trained(spec)
    state = model.state_dict()
    canonical = canonicalize(TransformerWeights.from_state_dict(state, spec)).state_dict(0)
    assert max((canonical[k] - v).abs().max().item() for k, v in state.items()) > 1e-3
    x = random_inputs(spec, 16, torch.Generator().manual_seed(5))
    with torch.no_grad():
        assert torch.allclose(transformed_copy(model, canonical)(x), model(x), atol=1e-10, rtol=0)


@settings(max_examples=15, deadline=None)
@given(spec_index=st.integers(0, 1), weight_seed=st.integers(0, 10_000), group_seed=st.integers(0, 10_000))
def test_the_interface_form_forgets_the_interface_permutations_and_commutes_with_the_group(
        spec_index: int, weight_seed: int, group_seed: int) -> None:
    """Permuting the features between blocks leaves the interface form exactly as it was; a paper-group element
    moves the form as it moves the weights (the two act on different indices)."""
    spec = SPECS[spec_index]
    weights = _weights(spec, weight_seed)
    generator = torch.Generator().manual_seed(group_seed)
    permuted = sample_interface_element(spec, generator).act(weights)
    assert _distance(permuted, weights) > 1e-3, "the interface element must actually move the weights"
    assert torch.equal(canonicalize_interfaces(permuted).to_params(), canonicalize_interfaces(weights).to_params())
    g = sample_group_element(spec, generator, 5.0)
    assert _distance(canonicalize_interfaces(g.act(weights)), g.act(canonicalize_interfaces(weights))) < 1e-10


@pytest.mark.parametrize("spec", SPECS, ids=["vision", "text"])
def test_the_interface_form_computes_the_same_logits(spec: ArchitectureSpec) -> None:
    model = briefly_trained(spec)
    state = model.state_dict()
    ordered = canonicalize_interfaces(TransformerWeights.from_state_dict(state, spec)).state_dict(0)
    assert max((ordered[k] - v).abs().max().item() for k, v in state.items()) > 1e-3
    packed = canonicalize_interfaces_params(TransformerWeights.from_state_dict(state, spec).to_params(), spec)
    assert torch.equal(packed, TransformerWeights.from_state_dict(ordered, spec).to_params())
    x = random_inputs(spec, 16, torch.Generator().manual_seed(6))
    with torch.no_grad():
        assert torch.allclose(transformed_copy(model, ordered)(x), model(x), atol=1e-10, rtol=0)
