"""Block tensors stacked over blocks, `[batch, blocks, channels, ...]`, the form the NFN layers compute on.

Stacking lets every layer handle all blocks (each with its own parameters) in one batched contraction.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from small_transformer_zoo.format.architecture import ArchitectureSpec
from small_transformer_zoo.weights.weight_space import BLOCK_TENSORS, BlockWeights, TransformerWeights, block_shapes

MLP_TENSORS = ("W_A", "b_A", "W_B", "b_B")


@dataclass
class BlockStack:
    """Every block tensor with a block axis after the batch axis: W_q is [B, n_blocks, C, h, D, D_k]."""

    tensors: dict[str, torch.Tensor]

    @classmethod
    def from_weights(cls, weights: TransformerWeights) -> "BlockStack":
        return cls({name: torch.stack([getattr(b, name) for b in weights.blocks], dim=1) for name in BLOCK_TENSORS})

    def to_blocks(self) -> list[BlockWeights]:
        count = self.tensors["W_q"].shape[1]
        return [BlockWeights(**{name: t[:, i] for name, t in self.tensors.items()}) for i in range(count)]

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.tensors[name]

    def map_mlp(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> "BlockStack":
        """Apply `fn` to W_A, b_A, W_B, b_B only (ReLU does not commute with GL, so W_q..W_o pass unchanged)."""
        return BlockStack({k: fn(v) if k in MLP_TENSORS else v for k, v in self.tensors.items()})


def check_stack(stack: BlockStack, spec: ArchitectureSpec, channels: int, where: str) -> None:
    """Raise a ValueError naming the tensor whose shape does not fit `spec` with `channels` channels."""
    shapes = block_shapes(spec)
    batch = stack["W_q"].shape[0]
    for name in BLOCK_TENSORS:
        tensor = stack[name]
        expected = (batch, spec.num_blocks, channels, *shapes[name])
        if tuple(tensor.shape) != expected:
            raise ValueError(f"{where}: tensor {name} has shape {tuple(tensor.shape)}, expected {expected} "
                             f"[batch, blocks, channels, ...] for heads={spec.num_heads}, D={spec.d_model}, "
                             f"D_k={spec.d_head}, D_A={spec.d_mlp}")
