"""A straightforward Transformer-NFN: one einsum per term of docs/design.md section 8, a loop over blocks, explicit per-head
QK_i and VO_i. It reads the parameters of `EquivariantLayer` / `InvariantLayer`, so tests check that the fast
layers compute exactly these terms, and `benchmarks/bench_nfn.py` measures the fast layers against it."""

from __future__ import annotations

import torch

from .layers import EquivariantLayer, InvariantLayer
from .weight_stack import BlockStack


class _SlicedPhi:
    """Views of one block's s / a / o weights by the term they belong to."""

    def __init__(self, s_weight: torch.Tensor, channels: int, d: int) -> None:
        w = s_weight.reshape(channels, d * d + 3 * d + 2, *s_weight.shape[1:])
        self.qk = w[:, : d * d].reshape(channels, d, d, *s_weight.shape[1:])
        self.vo = w[:, d * d : d * d + d]
        self.wa_total = w[:, d * d + d]
        self.wb = w[:, d * d + d + 1 : d * d + 2 * d + 1]
        self.ba_sum = w[:, d * d + 2 * d + 1]
        self.bb = w[:, d * d + 2 * d + 2 :]


class _Counts:
    """The divisor of a sum of `n` terms: `n` for the layers' means, 1 for the paper's sums."""

    def __init__(self, reduction: str) -> None:
        self.mean = reduction == "mean"

    def __call__(self, n: int) -> int:
        return n if self.mean else 1


def _per_head(x: BlockStack, b: int, m: _Counts) -> tuple[torch.Tensor, ...]:
    wq, wk, wv, wo = (x[name][:, b] for name in ("W_q", "W_k", "W_v", "W_o"))
    scale = 1.0 / m(wq.shape[-3] * wq.shape[-1])
    qk = torch.einsum("bchpk,bchqk->bchpq", wq, wk) * scale
    vo = torch.einsum("bchpv,bchvq->bchpq", wv, wo) * scale
    return qk, vo


def _invariant_terms(phi: _SlicedPhi, inputs: tuple[torch.Tensor, ...], out: slice | int, m: _Counts) -> torch.Tensor:
    """The six invariant terms (QK, VO, W_A total, W_B, b_A sum, b_B), one einsum each, for output section `out`;
    `inputs`: QK, VO, W_A, W_B, b_A, b_B of one block."""
    qk, vo, wa, wb, ba, bb = inputs
    d, d_a = wa.shape[-2], wa.shape[-1]
    return (torch.einsum("bchpq,cpqe...->be...", qk, phi.qk[..., out])
            + torch.einsum("bchpq,cpe...->be...", vo, phi.vo[..., out]) / m(d)
            + torch.einsum("bcjk,ce...->be...", wa, phi.wa_total[..., out]) / m(d * d_a)
            + torch.einsum("bcpq,cqe...->be...", wb, phi.wb[..., out]) / m(d_a)
            + torch.einsum("bck,ce...->be...", ba, phi.ba_sum[..., out]) / m(d_a)
            + torch.einsum("bcq,cqe...->be...", bb, phi.bb[..., out]))


def reference_equivariant(layer: EquivariantLayer, x: BlockStack) -> BlockStack:
    spec, c, m = layer.spec, layer.in_channels, _Counts(layer.reduction)
    d, d_a = spec.d_model, spec.d_mlp
    outputs: dict[str, list[torch.Tensor]] = {k: [] for k in ("W_q", "W_k", "W_v", "W_o", "W_A", "b_A", "W_B", "b_B")}
    for b in range(spec.num_blocks):
        qk, vo = _per_head(x, b, m)
        wa, wb, ba, bb, wo = (x[name][:, b] for name in ("W_A", "W_B", "b_A", "b_B", "W_o"))
        phi = _SlicedPhi(layer.s_weight[b], c, d)
        a_w = layer.a_weight[b].reshape(c, d + 2, *layer.a_weight.shape[2:])  # [c, D+2, e, 2+D]
        o_w = layer.o_weight[b].reshape(c, d + 1, -1)                           # [c, D+1, e]
        w_a = (_invariant_terms(phi, (qk, vo, wa, wb, ba, bb), 0, m)[..., None, None]
               + torch.einsum("bchpj,cpe->bej", vo, o_w[:, :d])[..., :, None]
               + torch.einsum("bcjk,ce->bej", wa, o_w[:, d])[..., :, None] / m(d_a)
               + torch.einsum("bcjk,ce->bek", wa, a_w[:, 0, :, 0])[..., None, :] / m(d)
               + torch.einsum("bcjk,ec->bejk", wa, layer.wa_identity[b])
               + torch.einsum("bckq,cqe->bek", wb, a_w[:, 1 : 1 + d, :, 0])[..., None, :]
               + torch.einsum("bck,ce->bek", ba, a_w[:, d + 1, :, 0])[..., None, :]
               + layer.wa_bias[b][:, None, None])
        b_a = (_invariant_terms(phi, (qk, vo, wa, wb, ba, bb), 1, m)[..., None]
               + torch.einsum("bcjk,ce->bek", wa, a_w[:, 0, :, 1]) / m(d)
               + torch.einsum("bckq,cqe->bek", wb, a_w[:, 1 : 1 + d, :, 1])
               + torch.einsum("bck,ce->bek", ba, a_w[:, d + 1, :, 1])
               + layer.ba_bias[b][:, None])
        cols = slice(2, 2 + d)
        w_b = (_invariant_terms(phi, (qk, vo, wa, wb, ba, bb), cols, m)[..., None, :]
               + torch.einsum("bcpj,cek->bejk", wa, a_w[:, 0, :, 2:]) / m(d)
               + torch.einsum("bcjq,cqek->bejk", wb, a_w[:, 1 : 1 + d, :, 2:])
               + torch.einsum("bcj,cek->bejk", ba, a_w[:, d + 1, :, 2:])
               + layer.wb_bias[b][:, None, :])
        b_b = _invariant_terms(phi, (qk, vo, wa, wb, ba, bb), slice(2 + d, 2 + 2 * d), m) + layer.bb_bias[b]
        for t, name in enumerate(("W_q", "W_k", "W_v")):
            outputs[name].append(torch.einsum("ecjp,bchpk->behjk", layer.qkv[b, t], x[name][:, b]))
        outputs["W_o"].append(torch.einsum("ec,bchvq->behvq", layer.o_mix[b, 1], wo)
                              + torch.einsum("ec,bchv->behv", layer.o_mix[b, 0], wo.sum(-1) / m(d))[..., None])
        for name, value in (("W_A", w_a), ("b_A", b_a), ("W_B", w_b), ("b_B", b_b)):
            outputs[name].append(value)
    return BlockStack({k: torch.stack(v, dim=1) for k, v in outputs.items()})


def reference_invariant(layer: InvariantLayer, x: BlockStack) -> torch.Tensor:
    spec, c, m = layer.spec, layer.in_channels, _Counts(layer.reduction)
    features = []
    for b in range(spec.num_blocks):
        qk, vo = _per_head(x, b, m)
        phi = _SlicedPhi(layer.weight[b][..., None], c, spec.d_model)
        wa, wb, ba, bb = (x[name][:, b] for name in ("W_A", "W_B", "b_A", "b_B"))
        out = _invariant_terms(phi, (qk, vo, wa, wb, ba, bb), 0, m) + layer.bias[b]
        if layer.norm_weight is not None:
            out = torch.nn.functional.layer_norm(out, (out.shape[-1],), layer.norm_weight[b], layer.norm_bias[b])
        features.append(out)
    return torch.cat(features, dim=1)
