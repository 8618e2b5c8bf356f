"""The weight-space view NFNs consume (docs/design.md section 7), and the way back to plain state_dicts.

Packed rows `[batch, n_params]` become per-block tensors in right-multiplication layout with a leading
`[batch, channels]`: `W_q, W_k: [B, C, h, D, D_k]`, `W_v: [B, C, h, D, D_v]`, `W_o: [B, C, h, D_v, D]`,
`W_A: [B, C, D, D_A]`, `b_A: [B, C, D_A]`, `W_B: [B, C, D_A, D]`, `b_B: [B, C, D]`. The conversion is a few
reshapes over the whole batch; there is no loop over rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..format.architecture import ArchitectureSpec

BLOCK_TENSORS = ("W_q", "W_k", "W_v", "W_o", "W_A", "b_A", "W_B", "b_B")


def pack_state_dict(state_dict: Mapping[str, Any], spec: ArchitectureSpec, where: str = "state_dict") -> np.ndarray:
    """One checkpoint's tensors as a packed float32 row, checking every name and shape."""
    layout = spec.parameters()
    expected = {p.name for p in layout}
    missing, unexpected = sorted(expected - set(state_dict)), sorted(set(state_dict) - expected)
    if missing or unexpected:
        raise ValueError(f"{where}: parameter names differ from the architecture: missing {missing[:5]}"
                         f"{' ...' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
                         f"{' ...' if len(unexpected) > 5 else ''}")
    row = np.empty(spec.n_params, dtype=np.float32)
    for info in layout:
        value = state_dict[info.name]
        array = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)
        if tuple(array.shape) != info.shape:
            raise ValueError(f"{where}: tensor {info.name!r} has shape {tuple(array.shape)}, expected {info.shape}")
        row[info.offset : info.offset + info.numel] = array.reshape(-1)
    return row


def unpack_params(params: torch.Tensor, spec: ArchitectureSpec) -> dict[str, torch.Tensor]:
    """Packed rows [B, n_params] to named tensors [B, *shape] (views, no copy)."""
    check_packed(params, spec)
    return {p.name: params[:, p.offset : p.offset + p.numel].reshape(params.shape[0], *p.shape)
            for p in spec.parameters()}


def check_packed(params: torch.Tensor, spec: ArchitectureSpec) -> None:
    if params.ndim != 2 or params.shape[1] != spec.n_params:
        raise ValueError(f"packed params must have shape [batch, {spec.n_params}] for this architecture, "
                         f"got {tuple(params.shape)}")


@dataclass
class BlockWeights:
    """One transformer block in NFN layout, each tensor with leading [batch, channels]."""

    W_q: torch.Tensor
    W_k: torch.Tensor
    W_v: torch.Tensor
    W_o: torch.Tensor
    W_A: torch.Tensor
    b_A: torch.Tensor
    W_B: torch.Tensor
    b_B: torch.Tensor

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "BlockWeights":
        return BlockWeights(**{name: fn(getattr(self, name)) for name in BLOCK_TENSORS})

    def as_dict(self) -> dict[str, torch.Tensor]:
        return {name: getattr(self, name) for name in BLOCK_TENSORS}


def block_shapes(spec: ArchitectureSpec) -> dict[str, tuple[int, ...]]:
    """Per-sample, per-channel shape of each block tensor in NFN layout."""
    h, d, dk, a = spec.num_heads, spec.d_model, spec.d_head, spec.d_mlp
    return {"W_q": (h, d, dk), "W_k": (h, d, dk), "W_v": (h, d, dk), "W_o": (h, dk, d),
            "W_A": (d, a), "b_A": (a,), "W_B": (a, d), "b_B": (d,)}


def _qkv_to_nfn(weight: torch.Tensor, spec: ArchitectureSpec) -> torch.Tensor:
    batch = weight.shape[0]
    return weight.transpose(-1, -2).reshape(batch, spec.d_model, spec.num_heads, spec.d_head).permute(0, 2, 1, 3)


def _qkv_from_nfn(w: torch.Tensor, spec: ArchitectureSpec) -> torch.Tensor:
    batch = w.shape[0]
    return w.permute(0, 2, 1, 3).reshape(batch, spec.d_model, spec.num_heads * spec.d_head).transpose(-1, -2)


@dataclass
class TransformerWeights:
    """A batch of checkpoints in NFN layout: encoder blocks, plus embedding and classifier in plain layout."""

    spec: ArchitectureSpec
    blocks: list[BlockWeights]
    embedding: dict[str, torch.Tensor]
    classifier: dict[str, torch.Tensor]

    @classmethod
    def from_params(cls, params: torch.Tensor, spec: ArchitectureSpec) -> "TransformerWeights":
        """Packed rows [B, n_params] to the NFN layout with one channel."""
        named = unpack_params(torch.as_tensor(params), spec)
        blocks = []
        for b in range(spec.num_blocks):
            pre = f"blocks.{b}"
            o = named[f"{pre}.attn.o_proj.weight"]
            blocks.append(BlockWeights(
                W_q=_qkv_to_nfn(named[f"{pre}.attn.q_proj.weight"], spec),
                W_k=_qkv_to_nfn(named[f"{pre}.attn.k_proj.weight"], spec),
                W_v=_qkv_to_nfn(named[f"{pre}.attn.v_proj.weight"], spec),
                W_o=o.transpose(-1, -2).reshape(o.shape[0], spec.num_heads, spec.d_head, spec.d_model),
                W_A=named[f"{pre}.mlp.fc1.weight"].transpose(-1, -2),
                b_A=named[f"{pre}.mlp.fc1.bias"],
                W_B=named[f"{pre}.mlp.fc2.weight"].transpose(-1, -2),
                b_B=named[f"{pre}.mlp.fc2.bias"],
            ).map(lambda t: t.unsqueeze(1)))
        embedding = {k: v for k, v in named.items() if k.startswith("embedding.")}
        classifier = {k: v for k, v in named.items() if k.startswith("classifier.")}
        return cls(spec, blocks, embedding, classifier)

    @classmethod
    def from_state_dict(cls, state_dict: Mapping[str, torch.Tensor], spec: ArchitectureSpec) -> "TransformerWeights":
        """One checkpoint (batch of 1) in its own dtype; names and shapes checked as in `pack_state_dict`."""
        pack_state_dict(state_dict, spec)  # validation only
        row = torch.cat([torch.as_tensor(state_dict[p.name]).reshape(-1) for p in spec.parameters()])
        return cls.from_params(row[None], spec)

    @property
    def batch_size(self) -> int:
        return self.blocks[0].W_q.shape[0]

    @property
    def channels(self) -> int:
        return self.blocks[0].W_q.shape[1]

    def validate(self) -> None:
        """Raise a ValueError naming the first tensor whose shape does not fit the spec."""
        if len(self.blocks) != self.spec.num_blocks:
            raise ValueError(f"weight space has {len(self.blocks)} blocks, the spec has {self.spec.num_blocks}")
        expected = block_shapes(self.spec)
        lead = tuple(self.blocks[0].W_q.shape[:2]) if self.blocks else None
        for b, block in enumerate(self.blocks):
            for name, tensor in block.as_dict().items():
                if tensor.ndim != 2 + len(expected[name]) or tuple(tensor.shape[2:]) != expected[name] \
                        or tuple(tensor.shape[:2]) != lead:
                    raise ValueError(f"blocks[{b}].{name} has shape {tuple(tensor.shape)}, expected "
                                     f"[batch, channels, {', '.join(map(str, expected[name]))}] with "
                                     f"[batch, channels] = {list(lead) if lead else '?'}")

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "TransformerWeights":
        """Apply `fn` to every tensor (dtype or device changes, detaching, ...)."""
        return TransformerWeights(self.spec, [b.map(fn) for b in self.blocks],
                                  {k: fn(v) for k, v in self.embedding.items()},
                                  {k: fn(v) for k, v in self.classifier.items()})

    def to(self, *args: Any, **kwargs: Any) -> "TransformerWeights":
        return self.map(lambda t: t.to(*args, **kwargs))

    def to_state_dicts(self) -> dict[str, torch.Tensor]:
        """Back to state_dict names and PyTorch shapes, batched: name -> [B, *shape]. Needs one channel."""
        if self.channels != 1:
            raise ValueError(f"only a one-channel weight space maps back to checkpoints, this has {self.channels}")
        spec, out = self.spec, {}
        out.update(self.embedding)
        for b, block in enumerate(self.blocks):
            blk = block.map(lambda t: t.squeeze(1))
            pre, batch = f"blocks.{b}", blk.W_q.shape[0]
            out[f"{pre}.attn.q_proj.weight"] = _qkv_from_nfn(blk.W_q, spec)
            out[f"{pre}.attn.k_proj.weight"] = _qkv_from_nfn(blk.W_k, spec)
            out[f"{pre}.attn.v_proj.weight"] = _qkv_from_nfn(blk.W_v, spec)
            out[f"{pre}.attn.o_proj.weight"] = blk.W_o.reshape(batch, spec.num_heads * spec.d_head,
                                                               spec.d_model).transpose(-1, -2)
            out[f"{pre}.mlp.fc1.weight"] = blk.W_A.transpose(-1, -2)
            out[f"{pre}.mlp.fc1.bias"] = blk.b_A
            out[f"{pre}.mlp.fc2.weight"] = blk.W_B.transpose(-1, -2)
            out[f"{pre}.mlp.fc2.bias"] = blk.b_B
        out.update(self.classifier)
        return {p.name: out[p.name] for p in spec.parameters()}

    def state_dict(self, index: int) -> dict[str, torch.Tensor]:
        """Checkpoint `index` of the batch as a state_dict for `small_transformer_zoo.weights.model.ZooTransformer`."""
        return {name: t[index].clone(memory_format=torch.contiguous_format) for name, t in self.to_state_dicts().items()}

    def to_params(self) -> torch.Tensor:
        """Back to packed rows [B, n_params]."""
        tensors = self.to_state_dicts()
        return torch.cat([t.reshape(t.shape[0], math.prod(t.shape[1:])) for t in tensors.values()], dim=1)
