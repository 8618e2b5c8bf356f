"""Alignment to a reference checkpoint by weight matching (Ainsworth et al., "Git Re-Basin", ICLR 2023), over the
permutations of the zoo's symmetry group (docs/design.md section 7): per block the heads (sigma), the query-key and
the value-output units inside each head (permutation matrices among GL(D_k) and GL(D_v)), the attention output
features (pi_O), the MLP units (pi_A) and the features the block hands on (the interfaces, `InterfaceElement`).

A permutation of one of these unit sets reorders slices of the tensors that hold it (columns of one layer, rows of
the next), so the permuted checkpoint computes the same function. Matching chooses each permutation to maximise
the inner product of the permuted checkpoint with the reference: one linear assignment per unit set
(`scipy.optimize.linear_sum_assignment`) given the others, started from fingerprints that no other permutation
changes (the sorted values of each unit's slices) and repeated, unit set by unit set, until nothing moves. A
permuted copy of the reference therefore aligns back to it exactly. Models that read index positions then see
indices that mean the same in every checkpoint; the function of every checkpoint is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from scipy.optimize import linear_sum_assignment

from ..format.architecture import ArchitectureSpec
from .weight_space import BlockWeights, TransformerWeights

MAX_SWEEPS = 30
FC1 = "classifier.fc1.weight"


@dataclass
class Permutations:
    """One checkpoint's element of the permutation group, per block: `heads` [h], `qk` [h, D_k] and `vo` [h, D_v]
    (the units of the new head i, taken from head heads[i]), `out` [D] (pi_O), `mlp` [D_A] (pi_A), `interface` [D]."""

    heads: list[np.ndarray]
    qk: list[np.ndarray]
    vo: list[np.ndarray]
    out: list[np.ndarray]
    mlp: list[np.ndarray]
    interface: list[np.ndarray]

    @classmethod
    def identity(cls, spec: ArchitectureSpec) -> "Permutations":
        n, h = spec.num_blocks, spec.num_heads
        return cls([np.arange(h) for _ in range(n)], [np.tile(np.arange(spec.d_head), (h, 1)) for _ in range(n)],
                   [np.tile(np.arange(spec.d_head), (h, 1)) for _ in range(n)], [np.arange(spec.d_model)] * n,
                   [np.arange(spec.d_mlp)] * n, [np.arange(spec.d_model)] * n)

    @classmethod
    def random(cls, spec: ArchitectureSpec, generator: np.random.Generator) -> "Permutations":
        n, h = spec.num_blocks, spec.num_heads
        units = lambda: np.stack([generator.permutation(spec.d_head) for _ in range(h)])  # noqa: E731
        return cls([generator.permutation(h) for _ in range(n)], [units() for _ in range(n)],
                   [units() for _ in range(n)], [generator.permutation(spec.d_model) for _ in range(n)],
                   [generator.permutation(spec.d_mlp) for _ in range(n)],
                   [generator.permutation(spec.d_model) for _ in range(n)])

    def act(self, weights: TransformerWeights) -> TransformerWeights:
        """The permuted checkpoint(s) (any leading [batch, channels]); the same function."""
        blocks = []
        for b, block in enumerate(weights.blocks):
            blocks.append(_permute_block(block, self, b))
        classifier = dict(weights.classifier)
        classifier[FC1] = classifier[FC1][..., torch.as_tensor(self.interface[-1])]
        return TransformerWeights(weights.spec, blocks, dict(weights.embedding), classifier)


def _permute_block(block: BlockWeights, p: Permutations, b: int) -> BlockWeights:
    heads = torch.as_tensor(p.heads[b])
    rows = torch.as_tensor(p.interface[b - 1]) if b > 0 else None

    def units(tensor: torch.Tensor, order: np.ndarray, axis: int) -> torch.Tensor:
        """Per new head i, its units `order[i]` along `axis` (-1: columns, -2: rows) of head heads[i]."""
        tensor = tensor.index_select(-3, heads)
        index = torch.as_tensor(order)
        if axis == -1:
            return torch.stack([tensor[..., i, :, :][..., index[i]] for i in range(len(index))], dim=-3)
        return torch.stack([tensor[..., i, :, :][..., index[i], :] for i in range(len(index))], dim=-3)

    wq, wk, wv = units(block.W_q, p.qk[b], -1), units(block.W_k, p.qk[b], -1), units(block.W_v, p.vo[b], -1)
    if rows is not None:
        wq, wk, wv = (w[..., rows, :] for w in (wq, wk, wv))
    out, mlp, interface = (torch.as_tensor(x[b]) for x in (p.out, p.mlp, p.interface))
    wo = units(block.W_o, p.vo[b], -2)[..., out]
    return replace(block, W_q=wq, W_k=wk, W_v=wv, W_o=wo, W_A=block.W_A[..., out, :][..., mlp], b_A=block.b_A[..., mlp],
                   W_B=block.W_B[..., mlp, :][..., interface], b_B=block.b_B[..., interface])


def _assign(similarity: np.ndarray) -> tuple[np.ndarray, float]:
    """The permutation (new unit i takes old unit perm[i]) maximising the summed similarity, and that sum."""
    rows, cols = linear_sum_assignment(similarity, maximize=True)
    perm = np.empty(len(rows), dtype=np.int64)
    perm[rows] = cols
    return perm, float(similarity[rows, cols].sum())


def _fingerprints(columns: list[np.ndarray]) -> np.ndarray:
    """Per unit (a column of each matrix given [rows, units]), its slices' values sorted: no permutation of the
    rows changes them."""
    return np.concatenate([np.sort(m, axis=0) for m in columns], axis=0).T


def _fingerprint_match(ref: list[np.ndarray], x: list[np.ndarray]) -> np.ndarray:
    a, b = _fingerprints(ref), _fingerprints(x)
    return _assign(-((a[:, None, :] - b[None, :, :]) ** 2).sum(-1))[0]


def _numpy(weights: TransformerWeights) -> dict:
    """One checkpoint's tensors as float64 arrays without the leading [1, 1]."""
    out = {"blocks": [{k: v.detach().double().numpy().reshape(v.shape[2:]) for k, v in b.as_dict().items()}
                      for b in weights.blocks]}
    out["fc1"] = weights.classifier[FC1].detach().double().numpy().reshape(weights.classifier[FC1].shape[-2:])
    return out


def match(reference: TransformerWeights, weights: TransformerWeights) -> Permutations:
    """The permutations that align one checkpoint (`weights`, batch of one) to `reference` (batch of one)."""
    spec = weights.spec
    ref = _numpy(reference)
    perms = _initial(ref, _numpy(weights), spec)
    for _ in range(MAX_SWEEPS):
        moved = False
        for b in range(spec.num_blocks):
            for site in (_heads_and_units, _attention_out, _mlp_units, _interface):
                moved |= site(ref, _numpy(perms.act(weights)), perms, b)
        if not moved:
            break
    return perms


def _initial(ref: dict, x: dict, spec: ArchitectureSpec) -> Permutations:
    """Permutations matched on fingerprints, site by site from the input side."""
    perms = Permutations.identity(spec)
    for b in range(spec.num_blocks):
        r, w = ref["blocks"][b], x["blocks"][b]
        head_prints = lambda t, i: np.sort(np.concatenate([t[k][i].ravel() for k in ("W_q", "W_k", "W_v", "W_o")]))  # noqa: E731
        a = np.stack([head_prints(r, i) for i in range(spec.num_heads)])
        c = np.stack([head_prints(w, i) for i in range(spec.num_heads)])
        perms.heads[b] = _assign(-((a[:, None] - c[None]) ** 2).sum(-1))[0]
        for i, j in enumerate(perms.heads[b]):
            perms.qk[b][i] = _fingerprint_match([r["W_q"][i], r["W_k"][i]], [w["W_q"][j], w["W_k"][j]])
            perms.vo[b][i] = _fingerprint_match([r["W_v"][i], r["W_o"][i].T], [w["W_v"][j], w["W_o"][j].T])
        perms.out[b] = _fingerprint_match([np.concatenate(list(r["W_o"]), 0), r["W_A"].T],
                                          [np.concatenate(list(w["W_o"]), 0), w["W_A"].T])
        perms.mlp[b] = _fingerprint_match([r["W_A"], r["b_A"][None], r["W_B"].T],
                                          [w["W_A"], w["b_A"][None], w["W_B"].T])
        last = b + 1 == spec.num_blocks
        perms.interface[b] = _fingerprint_match(
            [r["W_B"], r["b_B"][None], *_readers(None if last else ref["blocks"][b + 1], ref["fc1"])],
            [w["W_B"], w["b_B"][None], *_readers(None if last else x["blocks"][b + 1], x["fc1"])])
    return perms


def _readers(next_block: dict | None, fc1: np.ndarray) -> list[np.ndarray]:
    """What reads a block's output features, as [rows, features] matrices: the next block's projections, or the
    classifier's first layer."""
    if next_block is None:
        return [fc1]
    return [np.concatenate([t.transpose(0, 2, 1).reshape(-1, t.shape[1]) for t in
                            (next_block["W_q"], next_block["W_k"], next_block["W_v"])], 0)]


def _update(current: np.ndarray, new: np.ndarray) -> bool:
    changed = not np.array_equal(current, new)
    current[...] = new
    return changed


def _heads_and_units(ref: dict, x: dict, perms: Permutations, b: int) -> bool:
    """Heads and the units inside them, given everything else: for each (reference head, head) pair the best unit
    permutations, then the best pairing of heads. `x` is the checkpoint permuted as `perms` says now."""
    r, w = ref["blocks"][b], x["blocks"][b]
    h = len(perms.heads[b])
    value, qk, vo = np.zeros((h, h)), {}, {}
    for i in range(h):
        for j in range(h):
            s_qk = r["W_q"][i].T @ w["W_q"][j] + r["W_k"][i].T @ w["W_k"][j]
            s_vo = r["W_v"][i].T @ w["W_v"][j] + r["W_o"][i] @ w["W_o"][j].T
            qk[i, j], a = _assign(s_qk)
            vo[i, j], c = _assign(s_vo)
            value[i, j] = a + c
    pairing, _ = _assign(value)
    if np.array_equal(pairing, np.arange(h)) and all(np.array_equal(qk[i, i], np.arange(len(qk[i, i]))) and
                                                     np.array_equal(vo[i, i], np.arange(len(vo[i, i])))
                                                     for i in range(h)):
        return False
    heads, qk_now, vo_now = perms.heads[b].copy(), perms.qk[b].copy(), perms.vo[b].copy()
    for i, j in enumerate(pairing):  # compose with the permutation `x` already carries
        perms.heads[b][i] = heads[j]
        perms.qk[b][i] = qk_now[j][qk[i, j]]
        perms.vo[b][i] = vo_now[j][vo[i, j]]
    return True


def _compose(perm: np.ndarray, step: np.ndarray) -> bool:
    if np.array_equal(step, np.arange(len(step))):
        return False
    perm[...] = perm[step]
    return True


def _attention_out(ref: dict, x: dict, perms: Permutations, b: int) -> bool:
    r, w = ref["blocks"][b], x["blocks"][b]
    s = np.concatenate(list(r["W_o"]), 0).T @ np.concatenate(list(w["W_o"]), 0) + r["W_A"] @ w["W_A"].T
    return _compose(perms.out[b], _assign(s)[0])


def _mlp_units(ref: dict, x: dict, perms: Permutations, b: int) -> bool:
    r, w = ref["blocks"][b], x["blocks"][b]
    s = r["W_A"].T @ w["W_A"] + np.outer(r["b_A"], w["b_A"]) + r["W_B"] @ w["W_B"].T
    return _compose(perms.mlp[b], _assign(s)[0])


def _interface(ref: dict, x: dict, perms: Permutations, b: int) -> bool:
    r, w = ref["blocks"][b], x["blocks"][b]
    last = b + 1 == len(ref["blocks"])
    s = r["W_B"].T @ w["W_B"] + np.outer(r["b_B"], w["b_B"])
    for a, c in zip(_readers(None if last else ref["blocks"][b + 1], ref["fc1"]),
                    _readers(None if last else x["blocks"][b + 1], x["fc1"])):
        s += a.T @ c
    return _compose(perms.interface[b], _assign(s)[0])


def align_params(params: torch.Tensor, reference: torch.Tensor, spec: ArchitectureSpec) -> torch.Tensor:
    """Packed rows [B, n_params], each permuted to match the packed `reference` row (`match`); computed in float64,
    returned in the rows' dtype."""
    ref = TransformerWeights.from_params(reference.reshape(1, -1).double(), spec)
    out = torch.empty_like(params)
    for row in range(len(params)):
        weights = TransformerWeights.from_params(params[row : row + 1].double(), spec)
        out[row] = match(ref, weights).act(weights).to_params()[0].to(params.dtype)
    return out


def reference_row(params: torch.Tensor) -> int:
    """The reference a split is aligned to: the training checkpoint whose L2 norm is the median of the training
    split's (the lower one of two middles): no label is read, and no collapsed checkpoint of tiny norm is chosen."""
    norms = params.double().norm(dim=1)
    order = torch.argsort(norms, stable=True)
    return int(order[(len(order) - 1) // 2])
