"""Transformer-NFN layers: the G-equivariant polynomial layer E and the G-invariant layer I (docs/design.md section 8).

Every term of docs/design.md section 8 is here, but terms that read the same kind of input are computed together: each term
is a learned linear map of one of three feature sets, so the terms of one set are one matmul with the terms'
weights side by side.

- `s`, invariant features per block and channel: sum_i QK_i (D x D), sum_{i,q} VO_i[p, q] (D), total of W_A,
  sum_p W_B[p, q] (D), sum of b_A, b_B (D).
- `o`, features per attention-output index j (moved by pi_O): sum_i VO_i[:, j] (D), row sum of W_A[j, :].
- `a`, features per MLP hidden index a (moved by pi_A): column sum of W_A[:, a], W_B[a, :] (D), b_A[a].

The outputs are then sums of broadcasts: W_A' = s-terms + o-terms[j] + a-terms[k] + identity, b_A' = s-terms +
a-terms[k], W_B'[a, k] = s-terms[k] + a-terms[a, k], b_B' = s-terms[k], I = s-terms. Sums are divided by
their count (means; QK and VO by h D_k), so no feature exceeds the scale of its inputs, however correlated they
become; each term gets an equal share of its output's variance at initialisation (`reset_parameters`).
All blocks are computed at once, each with its own parameters, and heads enter only through sums over i.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from small_transformer_zoo.format.architecture import ArchitectureSpec

from .weight_stack import BlockStack


def head_sums(x: BlockStack) -> tuple[torch.Tensor, torch.Tensor]:
    """sum_i QK_i and sum_i VO_i, [B, n, C, D, D], each divided by h * D_k (a mean over heads and head
    dimensions); one matmul each."""
    wq, wk, wv, wo = x["W_q"], x["W_k"], x["W_v"], x["W_o"]
    *lead, h, d, dk = wq.shape
    scale = 1.0 / (h * dk)
    q_cat = wq.transpose(-3, -2).reshape(*lead, d, h * dk)
    k_cat = wk.transpose(-3, -2).reshape(*lead, d, h * dk)
    v_cat = wv.transpose(-3, -2).reshape(*lead, d, h * dk)
    o_cat = wo.reshape(*lead, h * dk, wo.shape[-1])
    return (q_cat @ k_cat.transpose(-1, -2)) * scale, (v_cat @ o_cat) * scale


def _norm_sum(t: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    return t.mean(dim=dims)


def invariant_features(x: BlockStack, qk: torch.Tensor, vo: torch.Tensor) -> torch.Tensor:
    """`s`: [B, n, C * F] with F = D^2 + 3 D + 2."""
    return feature_vector(qk, _norm_sum(vo, (-1,)), _norm_sum(x["W_A"], (-2, -1)), _norm_sum(x["W_B"], (-2,)),
                          _norm_sum(x["b_A"], (-1,)), x["b_B"])


def feature_vector(qk: torch.Tensor, vo_row_means: torch.Tensor, wa_mean: torch.Tensor,
                   wb_column_means: torch.Tensor, ba_mean: torch.Tensor, bb: torch.Tensor) -> torch.Tensor:
    """The invariant features from their parts (each [B, n, C, ...]): [B, n, C * F]."""
    parts = [qk.flatten(-2), vo_row_means, wa_mean[..., None], wb_column_means, ba_mean[..., None], bb]
    return torch.cat(parts, dim=-1).flatten(-2)


class _ReluMeanOfGridSum(torch.autograd.Function):
    """mean over (j, k) of relu(rows[j] + columns[k] + scale * base[j, k]). rows [..., E, J], columns [..., E, K],
    scale broadcast to [..., E], base [..., 1, J, K] shared over E (no gradient: the input weights). The mean and
    its gradient need only how many of each row's and column's entries are positive and the sum of `base` over
    the positive ones: the grid becomes its own sign mask in place, and the backward pass is a few small
    products. Written in the `setup_context` form with a generated vmap rule, so `torch.func.vmap` (several
    predictors trained together) runs it too; the counts travel as non-differentiable outputs."""

    generate_vmap_rule = True

    @staticmethod
    def forward(rows: torch.Tensor, columns: torch.Tensor, scale: torch.Tensor,
                base: torch.Tensor) -> tuple[torch.Tensor, ...]:
        grid = (rows[..., :, None] + columns[..., None, :]).contiguous()
        positive = grid.addcmul_(scale[..., None, None], base).gt_(0)   # the grid's sign mask, in place
        per_row, per_column = positive.sum(-1), positive.sum(-2)
        base_sum = (positive.flatten(-2) @ base.flatten(-2).transpose(-1, -2)).squeeze(-1)
        # The sum of the positive entries, term by term: rows[j] counted per_row[j] times, and so on.
        total = (rows * per_row).sum(-1) + (columns * per_column).sum(-1) + scale * base_sum
        return total / (grid.shape[-1] * grid.shape[-2]), per_row, per_column, base_sum

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[torch.Tensor, ...], output: tuple[torch.Tensor, ...]) -> None:
        rows, columns, scale, _ = inputs
        _, per_row, per_column, base_sum = output
        ctx.mark_non_differentiable(per_row, per_column, base_sum)
        ctx.save_for_backward(per_row, per_column, base_sum)
        ctx.count, ctx.scale_shape = rows.shape[-1] * columns.shape[-1], scale.shape

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *_: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        per_row, per_column, base_sum = ctx.saved_tensors
        each = grad / ctx.count
        grad_scale = _sum_to(each * base_sum, ctx.scale_shape) if ctx.needs_input_grad[2] else None
        return each[..., None] * per_row, each[..., None] * per_column, grad_scale, None


class _ReluRowMean(torch.autograd.Function):
    """mean over rows a of relu(grid[a, k] + shift[k]): grid [..., A, K], shift [..., K]. The shifted grid becomes
    its own sign mask in place (a float mask: the backward product then needs no cast), kept for the backward
    pass with each column's count of positive entries. vmap-able as `_ReluMeanOfGridSum` is."""

    generate_vmap_rule = True

    @staticmethod
    def forward(grid: torch.Tensor, shift: torch.Tensor) -> tuple[torch.Tensor, ...]:
        moved = (grid + shift[..., None, :]).relu_()
        out = moved.mean(-2)
        mask = moved.gt_(0)
        return out, mask, mask.sum(-2)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[torch.Tensor, ...], output: tuple[torch.Tensor, ...]) -> None:
        _, mask, per_column = output
        ctx.mark_non_differentiable(mask, per_column)
        ctx.save_for_backward(mask, per_column)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *_: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask, per_column = ctx.saved_tensors
        each = grad / mask.shape[-2]
        return mask * each[..., None, :], each * per_column


def _sum_to(tensor: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """`tensor` summed over the dimensions that broadcasting expanded from `shape`."""
    lead = tensor.dim() - len(shape)
    out = tensor.sum(tuple(range(lead))) if lead else tensor
    dims = tuple(i for i, size in enumerate(shape) if size == 1 and out.shape[i] != 1)
    return out.sum(dims, keepdim=True) if dims else out


def _left_then_right(left: torch.Tensor, middle: torch.Tensor, right: torch.Tensor | None) -> torch.Tensor:
    """left[n, e] @ middle[b, n] (@ right[n, e]) for every b and e: [B, n, e, D, D]. The left product is one
    matmul per block over all B (rows e and j, columns b and k); the right one is then a matmul per (n, e) over
    rows (j, b) that the first leaves contiguous."""
    n, e, d, _ = left.shape
    b = middle.shape[0]
    spread = middle.permute(1, 2, 0, 3).reshape(n, d, b * d)                       # [n, p, (b, k)]
    out = (left.reshape(n, e * d, d) @ spread).view(n, e, d * b, d)                # [n, e, (j, b), k]
    if right is not None:
        out = out @ right                                                          # [n, e, (j, b), l]
    return out.view(n, e, d, b, d).permute(3, 0, 1, 2, 4)


def output_index_features(x: BlockStack, vo: torch.Tensor) -> torch.Tensor:
    """`o`: [B, n, D, C * (D + 1)], one row per attention-output index j."""
    feats = torch.cat([vo.transpose(-1, -2), _norm_sum(x["W_A"], (-1,))[..., None]], dim=-1)  # [B,n,C,D,D+1]
    return feats.transpose(2, 3).flatten(-2)


def hidden_index_features(x: BlockStack) -> torch.Tensor:
    """`a`: [B, n, D_A, C * (D + 2)], one row per MLP hidden index."""
    wa = x["W_A"]
    feats = torch.cat([_norm_sum(wa, (-2,))[..., None], x["W_B"], x["b_A"][..., None]], dim=-1)  # [B,n,C,DA,D+2]
    return feats.transpose(2, 3).flatten(-2)


def invariant_feature_count(spec: ArchitectureSpec) -> int:
    d = spec.d_model
    return d * d + 3 * d + 2


REDUCTIONS = ("mean", "sum")


def feature_scales(spec: ArchitectureSpec, channels: int, reduction: str) -> dict[str, torch.Tensor]:
    """What turns each feature set's means into the paper's sums (all ones for "mean"): the number of terms each
    mean averages, per feature, repeated over `channels` (`s`, `o`, `a` as their features are laid out) and for
    W_o's column term (`wo`)."""
    if reduction not in REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; choose from {list(REDUCTIONS)}")
    d, a, hk = spec.d_model, spec.d_mlp, spec.num_heads * spec.d_head
    sections = {"s": [(d * d, hk), (d, hk * d), (1, d * a), (d, a), (1, a), (d, 1)],
                "o": [(d, hk), (1, a)], "a": [(1, d), (d, 1), (1, 1)]}
    out = {}
    for name, parts in sections.items():
        per_channel = torch.cat([torch.full((size,), float(count if reduction == "sum" else 1)) for size, count in parts])
        out[name] = per_channel.repeat(channels)
    out["wo"] = torch.tensor(float(d if reduction == "sum" else 1))
    return out


class EquivariantLayer(nn.Module):
    """E: block tensors with `in_channels` -> block tensors with `out_channels`, G-equivariant.

    `reduction`: "mean" (the default) divides every sum over heads and indices by its count; "sum" keeps the
    paper's sums. Both start as the same function (the sums' weights are drawn smaller by the same counts) and
    differ in how Adam moves them: its steps are per parameter, so a feature 1,000 times larger moves the output
    1,000 times faster per step."""

    def __init__(self, spec: ArchitectureSpec, in_channels: int, out_channels: int, reduction: str = "mean") -> None:
        super().__init__()
        self.spec, self.in_channels, self.out_channels = spec, in_channels, out_channels
        self.reduction = reduction
        for name, scale in feature_scales(spec, in_channels, reduction).items():
            self.register_buffer(f"{name}_scale", scale)
        n, c, e, d = spec.num_blocks, in_channels, out_channels, spec.d_model
        f = invariant_feature_count(spec)
        # W_q', W_k', W_v' = Phi[j, p] W[p, k], one Phi per tensor, shared over heads.
        self.qkv = nn.Parameter(torch.empty(n, 3, e, c, d, d))
        # W_o' = Phi1 * (column sum, broadcast) + Phi2 * W_o.
        self.o_mix = nn.Parameter(torch.empty(n, 2, e, c))
        # s-terms of W_A' (1), b_A' (1), W_B' (D per output column), b_B' (D).
        self.s_weight = nn.Parameter(torch.empty(n, c * f, e, 2 + 2 * d))
        # a-terms of W_A' (1), b_A' (1), W_B' (D per output column).
        self.a_weight = nn.Parameter(torch.empty(n, c * (d + 2), e, 2 + d))
        # o-terms of W_A'.
        self.o_weight = nn.Parameter(torch.empty(n, c * (d + 1), e))
        self.wa_identity = nn.Parameter(torch.empty(n, e, c))
        self.wa_bias = nn.Parameter(torch.zeros(n, e))
        self.ba_bias = nn.Parameter(torch.zeros(n, e))
        self.wb_bias = nn.Parameter(torch.zeros(n, e, d))
        self.bb_bias = nn.Parameter(torch.zeros(n, e, d))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Each term gets an equal share of its output's variance: Phi ~ N(0, gain^2 / (C * features * terms)).

        Features are means, so they never exceed their inputs' scale; the ReLU gain of 2 compensates for the
        half of the signal ReLU removes. Measured in tests: activations stay within a factor of a few over depth.
        """
        c, d = self.in_channels, self.spec.d_model
        gain = math.sqrt(2.0)
        terms = {"W_A": 12, "b_A": 9, "W_B": 9, "b_B": 6}
        s_sections = [d * d, d, 1, d, 1, d]   # QK, VO, W_A total, W_B, b_A sum, b_B
        a_sections = [1, d, 1]                 # column sum of W_A, W_B row, b_A entry
        o_sections = [d, 1]                    # VO column, row sum of W_A

        def fill(weight: torch.Tensor, sections: list[int], columns: list[tuple[slice, str]]) -> None:
            view = weight.view(weight.shape[0], c, sum(sections), *weight.shape[2:])
            if view.ndim == 4:  # one output only: give it a trailing section axis of length 1
                view = view.unsqueeze(-1)
            start = 0
            for size in sections:
                for cols, output in columns:
                    view[:, :, start : start + size, :, cols].normal_(0.0, gain / math.sqrt(c * size * terms[output]))
                start += size

        fill(self.s_weight, s_sections, [(slice(0, 1), "W_A"), (slice(1, 2), "b_A"), (slice(2, 2 + d), "W_B"),
                                         (slice(2 + d, 2 + 2 * d), "b_B")])
        fill(self.a_weight, a_sections, [(slice(0, 1), "W_A"), (slice(1, 2), "b_A"), (slice(2, 2 + d), "W_B")])
        fill(self.o_weight, o_sections, [(slice(None), "W_A")])
        self.wa_identity.normal_(0.0, gain / math.sqrt(c * terms["W_A"]))
        self.qkv.normal_(0.0, 1.0 / math.sqrt(c * d))
        self.o_mix.normal_(0.0, 1.0 / math.sqrt(2 * c))
        # Sums: the same function at initialisation as means, each weight smaller by its feature's count.
        self.s_weight.div_(self.s_scale[None, :, None, None])
        self.a_weight.div_(self.a_scale[None, :, None, None])
        self.o_weight.div_(self.o_scale[None, :, None])
        self.o_mix[:, 0].div_(self.wo_scale)

    def _mlp_outputs(self, x: BlockStack, qk: torch.Tensor, vo: torch.Tensor) -> dict[str, torch.Tensor]:
        """W_A', b_A', W_B', b_B': every term that reads the invariant, output-index and hidden-index features."""
        d = self.spec.d_model
        s = invariant_features(x, qk, vo) * self.s_scale                        # [B, n, c*f]
        o_feats = output_index_features(x, vo) * self.o_scale                  # [B, n, D, c*(D+1)]
        a_feats = hidden_index_features(x) * self.a_scale                      # [B, n, DA, c*(D+2)]

        s_out = torch.einsum("bnf,nfeo->bneo", s, self.s_weight)          # [B, n, e, 2+2D]
        # The hidden-index terms of each output as its own contraction (slicing one big output would cost a
        # zero-filled gradient of its whole size per slice in the backward pass).
        a_wa = torch.einsum("bnaf,nfe->bnea", a_feats, self.a_weight[..., 0])     # [B, n, e, DA]
        a_ba = torch.einsum("bnaf,nfe->bnea", a_feats, self.a_weight[..., 1])     # [B, n, e, DA]
        a_wb = torch.einsum("bnaf,nfeo->bneao", a_feats, self.a_weight[..., 2:])  # [B, n, e, DA, D]
        o_out = torch.einsum("bnjf,nfe->bnej", o_feats, self.o_weight)    # [B, n, e, D]

        # W_A' = (invariant + bias + row term)[j] + column term[k] + identity: one broadcast sum, then the identity
        # term added in place.
        rows = o_out + (s_out[..., 0] + self.wa_bias)[..., None]
        w_a = (rows[..., :, None] + a_wa[..., None, :]).add_(torch.einsum("nec,bncjk->bnejk", self.wa_identity,
                                                                           x["W_A"]))
        b_a = s_out[..., 1, None] + a_ba + self.ba_bias[..., None]
        w_b = a_wb + (s_out[..., 2 : 2 + d] + self.wb_bias)[..., None, :]
        b_b = s_out[..., 2 + d :] + self.bb_bias
        return {"W_A": w_a, "b_A": b_a, "W_B": w_b, "b_B": b_b}

    def forward(self, x: BlockStack) -> BlockStack:
        qk, vo = head_sums(x)
        qkv = [torch.einsum("necjp,bnchpk->bnehjk", self.qkv[:, t], x[name])
               for t, name in enumerate(("W_q", "W_k", "W_v"))]
        wo = x["W_o"]
        w_o = (torch.einsum("nec,bnchvq->bnehvq", self.o_mix[:, 1], wo)
               + torch.einsum("nec,bnchv->bnehv", self.o_mix[:, 0], _norm_sum(wo, (-1,)) * self.wo_scale)[..., None])
        return BlockStack({"W_q": qkv[0], "W_k": qkv[1], "W_v": qkv[2], "W_o": w_o, **self._mlp_outputs(x, qk, vo)})

    def forward_invariant_features(self, x: BlockStack) -> torch.Tensor:
        """The invariant features (`invariant_features`) of ReLU(this layer's output) for one input channel,
        without forming any output tensor whole: the attention summaries come from the input's head sums
        (`_head_summaries_out`), and the means of the ReLU'd MLP tensors from fused sums that keep only sign masks
        for the backward pass. The same function as `invariant_features` of the mapped output, to round-off."""
        if self.in_channels != 1:
            raise ValueError("forward_invariant_features takes one input channel; use forward")
        d = self.spec.d_model
        qk, vo = head_sums(x)
        qk_out, vo_rows_out = self._head_summaries_out(qk, vo)
        s = invariant_features(x, qk, vo) * self.s_scale
        o_feats, a_feats = output_index_features(x, vo) * self.o_scale, hidden_index_features(x) * self.a_scale
        s_out = torch.einsum("bnf,nfeo->bneo", s, self.s_weight)
        a_wa = torch.einsum("bnaf,nfe->bnea", a_feats, self.a_weight[..., 0])
        a_ba = torch.einsum("bnaf,nfe->bnea", a_feats, self.a_weight[..., 1])
        # The hidden-index terms of W_B' laid out as the contraction leaves them ([n, B, DA, e, D]: no copy to
        # another layout, forward or backward); their ReLU'd mean over hidden units is all the features need.
        a_wb = torch.einsum("bnaf,nfeo->nbaeo", a_feats, self.a_weight[..., 2:])
        o_out = torch.einsum("bnjf,nfe->bnej", o_feats, self.o_weight)
        rows = o_out + (s_out[..., 0] + self.wa_bias)[..., None]
        wa_mean = _ReluMeanOfGridSum.apply(rows, a_wa, self.wa_identity[None, :, :, 0], x["W_A"])[0]
        shift = (s_out[..., 2 : 2 + d] + self.wb_bias).transpose(0, 1)           # [n, B, e, D]
        wb_means = _ReluRowMean.apply(a_wb.flatten(-2), shift.flatten(-2))[0].view(shift.shape).transpose(0, 1)
        ba_mean = torch.relu(s_out[..., 1, None] + a_ba + self.ba_bias[..., None]).mean(-1)
        bb = torch.relu(s_out[..., 2 + d :] + self.bb_bias)
        return feature_vector(qk_out, vo_rows_out, wa_mean, wb_means, ba_mean, bb)

    def _head_summaries_out(self, qk: torch.Tensor, vo: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The output's QK' [B, n, e, D, D] and the row means of its VO' [B, n, e, D] from the input's head sums,
        without forming W_q', W_k', W_v', W_o' (one input channel).

        With one input channel, W_q'^i = Phi_q W_q^i and W_k'^i = Phi_k W_k^i, so QK' = Phi_q QK Phi_k^T (one
        large matmul per block and step instead of B * e small ones); and W_o'^i = m1 W_o^i + m0 mean_q(W_o^i) 1^T,
        so VO' = Phi_v (m1 VO + m0 mean_q(VO) 1^T), whose row means are (m1 + m0) Phi_v mean_q(VO) (m0 times D
        for sums)."""
        phi_q, phi_k, phi_v = self.qkv[:, 0, :, 0], self.qkv[:, 1, :, 0], self.qkv[:, 2, :, 0]   # [n, e, D, D]
        mix = self.o_mix[:, 0, :, 0] * self.wo_scale + self.o_mix[:, 1, :, 0]                  # [n, e]
        qk_out = _left_then_right(phi_q, qk[:, :, 0], phi_k.transpose(-1, -2))
        vo_rows = torch.einsum("nejp,bnp->bnej", phi_v, _norm_sum(vo[:, :, 0], (-1,))) * mix[..., None]
        return qk_out, vo_rows


class InvariantLayer(nn.Module):
    """I: block tensors with `in_channels` -> `out_channels` invariant features per block, concatenated.

    `reduction` as in `EquivariantLayer`; `block_norm`: a LayerNorm over each block's outputs, with parameters
    per block (the paper's)."""

    def __init__(self, spec: ArchitectureSpec, in_channels: int, out_channels: int, reduction: str = "mean",
                 block_norm: bool = False) -> None:
        super().__init__()
        self.spec, self.in_channels, self.out_channels, self.reduction = spec, in_channels, out_channels, reduction
        self.register_buffer("s_scale", feature_scales(spec, in_channels, reduction)["s"])
        f = invariant_feature_count(spec)
        self.weight = nn.Parameter(torch.empty(spec.num_blocks, in_channels * f, out_channels))
        self.bias = nn.Parameter(torch.zeros(spec.num_blocks, out_channels))
        self.norm_weight = nn.Parameter(torch.ones(spec.num_blocks, out_channels)) if block_norm else None
        self.norm_bias = nn.Parameter(torch.zeros(spec.num_blocks, out_channels)) if block_norm else None
        with torch.no_grad():  # six terms share the output variance, as in EquivariantLayer
            view = self.weight.view(spec.num_blocks, in_channels, f, out_channels)
            start = 0
            for size in (spec.d_model ** 2, spec.d_model, 1, spec.d_model, 1, spec.d_model):
                view[:, :, start : start + size].normal_(0.0, math.sqrt(2.0 / (in_channels * size * 6)))
                start += size
            self.weight.div_(self.s_scale[None, :, None])

    def forward(self, x: BlockStack) -> torch.Tensor:
        qk, vo = head_sums(x)
        return self.forward_features(invariant_features(x, qk, vo))

    def forward_features(self, s: torch.Tensor) -> torch.Tensor:
        """The layer on its input's invariant features `s` [B, n, C * F] (`invariant_features`, means)."""
        out = torch.einsum("bnf,nfe->bne", s * self.s_scale, self.weight) + self.bias
        if self.norm_weight is not None:
            out = nn.functional.layer_norm(out, (self.out_channels,)) * self.norm_weight + self.norm_bias
        return out.flatten(1)
