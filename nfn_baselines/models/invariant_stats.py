"""Statistics of a checkpoint's weights that the symmetry group leaves unchanged (docs/design.md section 9).

STATNN's statistics of `W_q`, `W_k`, `W_v` and `W_o` change when a head's queries and keys, or values and
outputs, are mapped by an invertible matrix, though the network computes the same function. These do not:

- per head, the products `QK_i = W_q^i W_k^i^T` and `VO_i = W_v^i W_o^i` (D x D): M_i and N_i cancel in them, and
  pi_O only permutes the columns of VO_i. Of each: its singular values (unchanged by any permutation of rows or
  columns) and the mean, variance and 0/25/50/75/100% quantiles of its entries (a multiset that permutations
  keep). Each statistic is averaged over the heads, so a head permutation changes nothing;
- the MLP tensors `W_A`, `b_A`, `W_B`, `b_B`: the group only permutes their entries, so their entry statistics are
  unchanged already;
- the embedding and the classifier, which the group does not act on: the same statistics of each tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from small_transformer_zoo.format.architecture import COMPONENTS, ArchitectureSpec
from small_transformer_zoo.weights.weight_space import TransformerWeights

QUANTILES = (0.0, 0.25, 0.5, 0.75, 1.0)
ENTRY_STATISTICS = 2 + len(QUANTILES)


def entry_statistics(tensor: torch.Tensor, dims: int) -> torch.Tensor:
    """Mean, variance and quantiles of the last `dims` dimensions' entries: [..., 7]."""
    flat = tensor.flatten(-dims)
    q = torch.tensor(QUANTILES, dtype=flat.dtype, device=flat.device)
    return torch.cat([flat.mean(-1, keepdim=True), flat.var(-1, keepdim=True, unbiased=False),
                      torch.quantile(flat, q, dim=-1).movedim(0, -1)], dim=-1)


def head_products(weights: TransformerWeights, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """QK_i and VO_i of one block, [B, h, D, D] (channel 0)."""
    b = weights.blocks[block]
    wq, wk, wv, wo = (t[:, 0] for t in (b.W_q, b.W_k, b.W_v, b.W_o))
    return wq @ wk.transpose(-1, -2), wv @ wo


def product_statistics(product: torch.Tensor, rank: int) -> torch.Tensor:
    """The `rank` largest singular values and the entry statistics of each head's product, averaged over heads."""
    singular = torch.linalg.svdvals(product)[..., :rank]
    return torch.cat([singular, entry_statistics(product, 2)], dim=-1).mean(dim=1)


def feature_count(spec: ArchitectureSpec, components: Sequence[str] = COMPONENTS) -> int:
    count = 0
    if "encoder" in components:
        count += spec.num_blocks * (2 * (spec.d_head + ENTRY_STATISTICS) + 4 * ENTRY_STATISTICS)
    for component in ("embedding", "classifier"):
        if component in components:
            count += ENTRY_STATISTICS * sum(spec.component(p.name) == component for p in spec.parameters())
    return count


def invariant_statistics(weights: TransformerWeights, components: Sequence[str] = COMPONENTS) -> torch.Tensor:
    """[batch, feature_count(spec, components)] statistics that every element of the symmetry group leaves
    unchanged (module docstring)."""
    spec = weights.spec
    parts = []
    if "encoder" in components:
        for index, block in enumerate(weights.blocks):
            qk, vo = head_products(weights, index)
            parts += [product_statistics(qk, spec.d_head), product_statistics(vo, spec.d_head)]
            parts += [entry_statistics(t[:, 0], t.ndim - 2) for t in (block.W_A, block.b_A, block.W_B, block.b_B)]
    for component in ("embedding", "classifier"):
        if component in components:
            tensors = weights.embedding if component == "embedding" else weights.classifier
            parts += [entry_statistics(t, t.ndim - 1) for t in tensors.values()]
    return torch.cat(parts, dim=-1)
