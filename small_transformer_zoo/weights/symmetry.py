"""The symmetry group of the zoo's attention blocks (docs/design.md section 7), acting on weight spaces and state_dicts.

Per block, G = S_h x GL(D_k)^h x GL(D_v)^h x S_D x S_{D_A}: a head permutation sigma, per-head invertible
M_i and N_i, a permutation pi_O of the attention output dimension and pi_A of the MLP hidden units:

    W_q^i <- W_q^{sigma(i)} M_i^T      W_k^i <- W_k^{sigma(i)} M_i^{-1}
    W_v^i <- W_v^{sigma(i)} N_i        W_o^i <- N_i^{-1} W_o^{sigma(i)} P_O
    W_A <- P_O^{-1} W_A P_A            b_A <- b_A P_A
    W_B <- P_A^{-1} W_B                b_B unchanged

With (Y P)[:, j] = Y[:, pi(j)], "X P" is column indexing by pi and "P^{-1} W" is row indexing by pi. Because
blocks have no residual connection and LayerNorm has no affine part, a transformed checkpoint computes the same
function. Every tensor may carry any leading [batch, channels] dims: the element acts the same on each.

The same two facts give a symmetry the paper's group leaves out (`InterfaceElement`): the width-D features that
block i hands on (the columns of its W_B and b_B) may be permuted by pi_i, if whatever reads them takes its inputs
in the same order: the rows of W_q, W_k, W_v of block i + 1, or the columns of the classifier's first layer after
the last block (the final LayerNorm and the mean over tokens keep the order). The embedding's output is not
permuted: the position table added to it is fixed.

`randomize_params` moves every checkpoint of a batch by its own random element of either group, or of both.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import torch

from ..format.architecture import ArchitectureSpec
from .groups import RANDOMIZE_GROUPS
from .weight_space import BlockWeights, TransformerWeights


@dataclass
class BlockGroupElement:
    """One block's group element; M and N are [h, D_k, D_k], the rest permutations (index tensors)."""

    sigma: torch.Tensor
    M: torch.Tensor
    N: torch.Tensor
    pi_O: torch.Tensor
    pi_A: torch.Tensor

    def act(self, block: BlockWeights) -> BlockWeights:
        """g . block, for tensors with any leading dims (the head axis is the third from last for W_q..W_o)."""
        dtype = block.W_q.dtype
        M, N = self.M.to(dtype), self.N.to(dtype)
        wq = block.W_q.index_select(-3, self.sigma) @ M.transpose(-1, -2)
        wk = block.W_k.index_select(-3, self.sigma) @ torch.linalg.inv(M)
        wv = block.W_v.index_select(-3, self.sigma) @ N
        wo = (torch.linalg.inv(N) @ block.W_o.index_select(-3, self.sigma)).index_select(-1, self.pi_O)
        wa = block.W_A.index_select(-2, self.pi_O).index_select(-1, self.pi_A)
        return BlockWeights(W_q=wq, W_k=wk, W_v=wv, W_o=wo, W_A=wa, b_A=block.b_A.index_select(-1, self.pi_A),
                            W_B=block.W_B.index_select(-2, self.pi_A), b_B=block.b_B)


@dataclass
class GroupElement:
    """One element per block; embedding and classifier are left as they are."""

    blocks: list[BlockGroupElement]

    def act(self, weights: TransformerWeights) -> TransformerWeights:
        if len(self.blocks) != len(weights.blocks):
            raise ValueError(f"group element has {len(self.blocks)} blocks, the weights have {len(weights.blocks)}")
        return TransformerWeights(weights.spec, [g.act(b) for g, b in zip(self.blocks, weights.blocks)],
                                  dict(weights.embedding), dict(weights.classifier))

    def act_on_state_dict(self, state_dict: Mapping[str, torch.Tensor], spec: ArchitectureSpec) -> dict[str, torch.Tensor]:
        """The transformed checkpoint as a state_dict (dtype kept, so float64 checks stay exact)."""
        weights = TransformerWeights.from_state_dict(state_dict, spec)
        return self.act(weights).state_dict(0)


def random_invertible(count: int, size: int, condition_number: float, generator: torch.Generator,
                      dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """`count` random [size, size] matrices U diag(s) V^T with singular values in [1, condition_number]."""
    if condition_number < 1:
        raise ValueError(f"condition_number must be >= 1, got {condition_number}")

    def orthogonal() -> torch.Tensor:
        q, r = torch.linalg.qr(torch.randn(count, size, size, generator=generator, dtype=torch.float64))
        return q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)

    log_s = torch.rand(count, size, generator=generator, dtype=torch.float64) * torch.log(
        torch.tensor(float(condition_number), dtype=torch.float64))
    s = torch.exp(log_s)
    return (orthogonal() * s.unsqueeze(-2) @ orthogonal().transpose(-1, -2)).to(dtype)


def sample_group_element(spec: ArchitectureSpec, generator: torch.Generator | None = None,
                         condition_number: float = 10.0) -> GroupElement:
    """A random element of G for every block: uniform permutations and well-conditioned M_i, N_i."""
    generator = generator or torch.Generator().manual_seed(0)
    blocks = []
    for _ in range(spec.num_blocks):
        blocks.append(BlockGroupElement(
            sigma=torch.randperm(spec.num_heads, generator=generator),
            M=random_invertible(spec.num_heads, spec.d_head, condition_number, generator),
            N=random_invertible(spec.num_heads, spec.d_head, condition_number, generator),
            pi_O=torch.randperm(spec.d_model, generator=generator),
            pi_A=torch.randperm(spec.d_mlp, generator=generator),
        ))
    return GroupElement(blocks)


@dataclass
class InterfaceElement:
    """Permutations `pi[i]` of the D features block i hands on (module docstring), one per block."""

    pi: list[torch.Tensor]

    def act(self, weights: TransformerWeights) -> TransformerWeights:
        if len(self.pi) != len(weights.blocks):
            raise ValueError(f"interface element has {len(self.pi)} permutations, the weights have "
                             f"{len(weights.blocks)} blocks")
        blocks = []
        for i, block in enumerate(weights.blocks):
            if i > 0:
                before = self.pi[i - 1]
                block = replace(block, W_q=block.W_q.index_select(-2, before), W_k=block.W_k.index_select(-2, before),
                                W_v=block.W_v.index_select(-2, before))
            blocks.append(replace(block, W_B=block.W_B.index_select(-1, self.pi[i]),
                                  b_B=block.b_B.index_select(-1, self.pi[i])))
        classifier = dict(weights.classifier)
        classifier["classifier.fc1.weight"] = classifier["classifier.fc1.weight"].index_select(-1, self.pi[-1])
        return TransformerWeights(weights.spec, blocks, dict(weights.embedding), classifier)

    def act_on_state_dict(self, state_dict: Mapping[str, torch.Tensor], spec: ArchitectureSpec) -> dict[str, torch.Tensor]:
        return self.act(TransformerWeights.from_state_dict(state_dict, spec)).state_dict(0)


def sample_interface_element(spec: ArchitectureSpec, generator: torch.Generator | None = None) -> InterfaceElement:
    """A uniformly random permutation of every block's output features."""
    generator = generator or torch.Generator().manual_seed(0)
    return InterfaceElement([torch.randperm(spec.d_model, generator=generator) for _ in range(spec.num_blocks)])


def randomize_params(params: torch.Tensor, spec: ArchitectureSpec, group: str, keys: Sequence[str],
                     seed: int = 0) -> torch.Tensor:
    """Packed rows [B, n_params], each moved by a random element of `group` (`RANDOMIZE_GROUPS`): the paper's
    group, the interface permutations, or both. Row b's element is drawn from a generator seeded by `seed` and
    `keys[b]` (its checkpoint id), so it does not depend on which other rows are moved with it."""
    if group not in RANDOMIZE_GROUPS:
        raise ValueError(f"unknown group {group!r}; choose from {list(RANDOMIZE_GROUPS)}")
    if len(keys) != len(params):
        raise ValueError(f"{len(keys)} keys for {len(params)} rows")
    out = torch.empty_like(params)
    for b, key in enumerate(keys):
        digest = hashlib.sha256(f"randomize:{seed}:{key}".encode()).digest()
        generator = torch.Generator().manual_seed(int.from_bytes(digest[:8], "big") >> 1)
        weights = TransformerWeights.from_params(params[b : b + 1].double(), spec)
        if group in ("paper-group", "all"):
            weights = sample_group_element(spec, generator).act(weights)
        if group in ("interfaces", "all"):
            weights = sample_interface_element(spec, generator).act(weights)
        out[b] = weights.to_params()[0].to(params.dtype)
    return out
