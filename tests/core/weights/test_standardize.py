"""Standardisation pooled over the indices the group moves: it commutes with the group, so the NFN stays invariant."""

import json

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nfn_baselines.models.model import TransformerNFN
from small_transformer_zoo.format.architecture import mnist_spec
from small_transformer_zoo.weights.standardize import WeightStats
from small_transformer_zoo.weights.symmetry import sample_group_element
from small_transformer_zoo.weights.collate import WeightSpaceCollator
from small_transformer_zoo.weights.weight_space import TransformerWeights

SPEC = mnist_spec()


def _weights(seed: int, count: int = 12) -> TransformerWeights:
    generator = torch.Generator().manual_seed(seed)
    params = torch.randn(count, SPEC.n_params, generator=generator, dtype=torch.float64)
    return TransformerWeights.from_params(params * 0.3 + 0.05 * torch.randn(SPEC.n_params, generator=generator,
                                                                            dtype=torch.float64), SPEC)


@settings(max_examples=20, deadline=None)
@given(weight_seed=st.integers(0, 10_000), group_seed=st.integers(0, 10_000))
def test_standardising_commutes_with_the_group(weight_seed: int, group_seed: int) -> None:
    weights = _weights(weight_seed)
    stats = WeightStats.of(weights)
    g = sample_group_element(SPEC, torch.Generator().manual_seed(group_seed))
    moved_then_standard = stats.apply(g.act(weights)).to_params()
    standard_then_moved = g.act(stats.apply(weights)).to_params()
    assert (moved_then_standard - standard_then_moved).abs().max() < 1e-9


def test_the_nfn_stays_invariant_on_standardised_weights() -> None:
    weights = _weights(1)
    stats = WeightStats.from_dict(json.loads(json.dumps(WeightStats.of(weights).to_dict())))  # as stored
    torch.manual_seed(0)
    model = TransformerNFN(SPEC).double().eval()
    g = sample_group_element(SPEC, torch.Generator().manual_seed(2))
    with torch.no_grad():
        original = model(stats.apply(weights))
        moved = model(stats.apply(g.act(weights)))
    assert torch.allclose(original, moved, atol=1e-9, rtol=0)
    assert not torch.allclose(model(weights), original)


def test_standardised_training_split_has_unit_spread_where_centred() -> None:
    weights = _weights(3, count=64)
    standard = WeightStats.of(weights).apply(weights)
    block = standard.blocks[0]
    assert abs(block.W_A.mean().item()) < 1e-9 and abs(block.W_A.std(unbiased=False).item() - 1) < 1e-9
    assert block.W_B.mean(dim=(0, 1, 2)).abs().max() < 1e-9
    assert (block.W_q.pow(2).mean(dim=(0, 1, 2, 4)).sqrt() - 1).abs().max() < 1e-9


def test_collator_applies_canonical_form_and_statistics() -> None:
    weights = _weights(4, count=4)
    rows = [{"params": p, "test_accuracy": 0.5, "checkpoint_id": f"c{i}"} for i, p in enumerate(weights.to_params())]
    stats = WeightStats.of(weights)
    batch = WeightSpaceCollator(SPEC, dtype=torch.float64, standardize=stats)(rows)
    assert torch.allclose(batch.weights.to_params(), stats.apply(weights).to_params())
    from small_transformer_zoo.weights.canonical import canonicalize

    both = WeightSpaceCollator(SPEC, dtype=torch.float64, canonical=True, standardize=stats)(rows)
    assert torch.allclose(both.weights.to_params(), stats.apply(canonicalize(weights)).to_params())
