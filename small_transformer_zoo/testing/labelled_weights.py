"""Labelled weights for tests and benchmarks of predictors: random checkpoints whose label is a known smooth
function of one invariant quantity, so a predictor that learns from weights has something real to find."""

from __future__ import annotations

import torch

from ..format.architecture import ArchitectureSpec
from ..weights.weight_space import TransformerWeights


def shifted_bias_weights(spec: ArchitectureSpec, count: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` flat weight vectors of `spec` (entries N(0, 0.2^2)) whose last block's `b_B` is shifted by a
    uniform s in [-1, 1], labelled sigmoid(3 s): the label is a function of an invariant (the mean of that bias)."""
    generator = torch.Generator().manual_seed(seed)
    params = torch.randn(count, spec.n_params, generator=generator) * 0.2
    shift = torch.rand(count, generator=generator) * 2 - 1
    weights = TransformerWeights.from_params(params, spec)
    weights.blocks[-1].b_B += shift[:, None, None]
    return weights.to_params(), torch.sigmoid(3 * shift)
