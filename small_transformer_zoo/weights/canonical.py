"""A canonical form of transformer weights under the attention blocks' symmetry group (docs/design.md section 7).

`canonicalize` maps every checkpoint to one representative of its orbit, so that g . W and W give the same
weights for every group element g, and the representative computes the same function as W. Per block:

1. MLP hidden units (pi_A) sorted by `|W_A[:, k]|^2 + b_A[k]^2 + |W_B[k, :]|^2`, which pi_O leaves alone.
2. Attention-output features (pi_O) sorted by `|W_A[j, :]|^2 + sum_i |VO_i[:, j]|^2`, which pi_A, M_i and N_i
   leave alone (VO_i = W_v^i W_o^i).
3. Each head's query-key and value-output pairs replaced by a fixed factorisation of their products: with
   QK_i = W_q^i W_k^i^T = U S V^T (its first D_k singular vectors), W_q^i = U S^1/2 and W_k^i = V S^1/2; likewise
   W_v^i = U' S'^1/2 and W_o^i = S'^1/2 V'^T from VO_i. Both products are unchanged by M_i and N_i, so the factors
   are too; each singular pair's sign is fixed by making the largest entry (in magnitude) of its left vector
   positive, which a permutation of VO_i's columns does not move.
4. Heads sorted by `|QK_i|_F + |VO_i|_F`.

`canonicalize_interfaces` fixes the symmetry the paper's group leaves out (`symmetry.InterfaceElement`): the D
features block i hands on are sorted by `|W_B[:, j]|^2 + b_B[j]^2`, which the paper's group leaves alone (pi_A
only reorders W_B's rows) and which an interface permutation moves with the features; whatever reads them (the
next block's W_q, W_k, W_v rows, or the classifier's first layer) is reordered the same way. The paper's group
and the interface permutations act on different indices, so the two forms compose: the interface form of g . W
is g applied to the interface form of W.

The scores are continuous functions of the weights: for generic checkpoints no two are equal, and the form is
unique. Where two are exactly equal (say, two identical hidden units) any order is a valid representative and
the function is the same; only canonical forms near such ties are sensitive to round-off. Computed in float64,
returned in the input's dtype; the embedding and the classifier, which the group does not act on, are copied.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from ..format.architecture import ArchitectureSpec
from .weight_space import BlockWeights, TransformerWeights


def canonicalize(weights: TransformerWeights) -> TransformerWeights:
    """Every checkpoint of the batch in its canonical form (any number of channels)."""
    return TransformerWeights(weights.spec, [canonical_block(block) for block in weights.blocks],
                              dict(weights.embedding), dict(weights.classifier))


def canonicalize_interfaces(weights: TransformerWeights) -> TransformerWeights:
    """Every checkpoint of the batch with the features between blocks in canonical order (module docstring);
    the function it computes is unchanged."""
    blocks, order = [], None
    for block in weights.blocks:
        if order is not None:
            block = replace(block, W_q=_take(block.W_q, order, -2), W_k=_take(block.W_k, order, -2),
                            W_v=_take(block.W_v, order, -2))
        x_b, b_b = block.W_B.to(torch.float64), block.b_B.to(torch.float64)
        order = (x_b.pow(2).sum(-2) + b_b.pow(2)).argsort(dim=-1)
        blocks.append(replace(block, W_B=_take(block.W_B, order, -1), b_B=_take(block.b_B, order, -1)))
    classifier = dict(weights.classifier)
    if order is not None:
        classifier["classifier.fc1.weight"] = _take(classifier["classifier.fc1.weight"], order, -1)
    return TransformerWeights(weights.spec, blocks, dict(weights.embedding), classifier)


def canonicalize_interfaces_params(params: torch.Tensor, spec: ArchitectureSpec) -> torch.Tensor:
    """Packed rows [B, n_params] with their interfaces in canonical order (`canonicalize_interfaces`)."""
    return canonicalize_interfaces(TransformerWeights.from_params(params, spec)).to_params().to(params.dtype)


def canonicalize_params(params: torch.Tensor, spec: ArchitectureSpec) -> torch.Tensor:
    """Packed rows [B, n_params] to the packed rows of their canonical forms."""
    return canonicalize(TransformerWeights.from_params(params, spec)).to_params().to(params.dtype)


def _take(tensor: torch.Tensor, order: torch.Tensor, dim: int) -> torch.Tensor:
    """`tensor` reordered along `dim` by `order` [*lead, n], one order per leading index (the batch and channel
    dims, which `tensor` starts with)."""
    dim = dim % tensor.ndim
    lead = order.ndim - 1
    shape = (*order.shape[:-1], *([1] * (dim - lead)), order.shape[-1], *([1] * (tensor.ndim - dim - 1)))
    return tensor.gather(dim, order.reshape(shape).expand(tensor.shape))


def _factor(product: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`product` [..., D, D] = left @ right^T with left, right [..., D, rank] from the SVD, signs fixed."""
    u, s, vh = torch.linalg.svd(product)
    u, s, v = u[..., :rank], s[..., :rank], vh[..., :rank, :].transpose(-1, -2)
    largest = u.abs().argmax(dim=-2, keepdim=True)
    sign = torch.sign(u.gather(-2, largest))
    sign = torch.where(sign == 0, torch.ones_like(sign), sign)
    root = s.sqrt().unsqueeze(-2)
    return u * sign * root, v * sign * root


def canonical_block(block: BlockWeights) -> BlockWeights:
    """The canonical form of one block (tensors with leading [batch, channels])."""
    dtype = block.W_q.dtype
    x = block.map(lambda t: t.to(torch.float64))
    hidden = (x.W_A.pow(2).sum(-2) + x.b_A.pow(2) + x.W_B.pow(2).sum(-1)).argsort(dim=-1)
    w_a, b_a, w_b = _take(x.W_A, hidden, -1), _take(x.b_A, hidden, -1), _take(x.W_B, hidden, -2)
    qk = x.W_q @ x.W_k.transpose(-1, -2)
    vo = x.W_v @ x.W_o
    output = (w_a.pow(2).sum(-1) + vo.pow(2).sum(dim=(-3, -2))).argsort(dim=-1)
    w_a = _take(w_a, output, -2)
    vo = _take(vo, output, -1)
    rank = x.W_q.shape[-1]
    w_q, w_k = _factor(qk, rank)
    w_v, w_o_t = _factor(vo, rank)
    heads = (torch.linalg.matrix_norm(qk) + torch.linalg.matrix_norm(vo)).argsort(dim=-1)
    w_q, w_k, w_v, w_o_t = (_take(t, heads, -3) for t in (w_q, w_k, w_v, w_o_t))
    out = BlockWeights(W_q=w_q, W_k=w_k, W_v=w_v, W_o=w_o_t.transpose(-1, -2), W_A=w_a, b_A=b_a, W_B=w_b,
                       b_B=x.b_B)
    return out.map(lambda t: t.to(dtype))
