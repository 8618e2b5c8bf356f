"""The Transformer-NFN model (docs/design.md section 8): an invariant encoder branch plus MLP branches, predicting accuracy.

encoder: E (1 -> c) [-> ReLU -> E (c -> c)]* -> ReLU -> I (c -> c) -> LayerNorm -> MLP
classifier / embedding: MLP over the flattened weights of that component
head: concatenated branch outputs -> Linear -> sigmoid
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from small_transformer_zoo.format.architecture import COMPONENTS, ArchitectureSpec
from small_transformer_zoo.weights.weight_space import TransformerWeights

from .layers import EquivariantLayer, InvariantLayer
from .weight_stack import BlockStack, check_stack



def mlp(d_in: int, hidden: int, depth: int = 2) -> nn.Sequential:
    """depth x (Linear -> ReLU)."""
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Linear(d_in if i == 0 else hidden, hidden), nn.ReLU()]
    return nn.Sequential(*layers)


def flat_component(weights: TransformerWeights, component: str) -> torch.Tensor:
    tensors = weights.embedding if component == "embedding" else weights.classifier
    return torch.cat([t.flatten(1) for t in tensors.values()], dim=1)


class TransformerNFNEncoder(nn.Module):
    """The G-invariant encoder branch: equivariant layers, ReLU on the MLP tensors, then the invariant layer."""

    def __init__(self, spec: ArchitectureSpec, channels: int = 10, num_layers: int = 1) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be at least 1, got {num_layers}")
        self.spec = spec
        self.layers = nn.ModuleList(EquivariantLayer(spec, 1 if i == 0 else channels, channels)
                                    for i in range(num_layers))
        self.invariant = InvariantLayer(spec, channels, channels)
        self.out_features = spec.num_blocks * channels

    def equivariant(self, stack: BlockStack) -> BlockStack:
        for layer in self.layers:
            stack = layer(stack).map_mlp(torch.relu)
        return stack

    def forward(self, stack: BlockStack) -> torch.Tensor:
        return self.invariant(self.equivariant(stack))


class TransformerNFN(nn.Module):
    """Predicts a checkpoint's accuracy (a probability) from its weights.

    `components` chooses what the model sees (any of encoder, embedding, classifier); the paper's setting is
    channels = hidden = 10 with one equivariant layer.
    """

    def __init__(self, spec: ArchitectureSpec, channels: int = 10, hidden: int = 10, num_layers: int = 1,
                 components: Sequence[str] = COMPONENTS) -> None:
        super().__init__()
        unknown = sorted(set(components) - set(COMPONENTS))
        if unknown or not components:
            raise ValueError(f"components must be a non-empty subset of {COMPONENTS}, got {list(components)}")
        self.spec = spec
        self.components = tuple(c for c in COMPONENTS if c in components
                                and not (c == "embedding" and spec.modality == "text"))
        branches, width = {}, 0
        if "encoder" in self.components:
            encoder = TransformerNFNEncoder(spec, channels, num_layers)
            branches["encoder"] = nn.Sequential(nn.LayerNorm(encoder.out_features), mlp(encoder.out_features, hidden))
            self.encoder = encoder
        for component in ("embedding", "classifier"):
            if component in self.components:
                size = sum(p.numel for p in spec.parameters() if spec.component(p.name) == component)
                branches[component] = mlp(size, hidden)
        width = hidden * len(branches)
        self.branches = nn.ModuleDict(branches)
        self.head = nn.Linear(width, 1)

    def check(self, weights: TransformerWeights) -> BlockStack:
        """Stack the blocks and check every tensor against this model's spec (clear errors, before any math)."""
        spec = weights.spec
        mine = self.spec
        for field in ("num_heads", "num_blocks", "d_model", "d_head", "d_mlp", "num_classes"):
            if getattr(spec, field) != getattr(mine, field):
                raise ValueError(f"weights have {field}={getattr(spec, field)}, this model was built for "
                                 f"{field}={getattr(mine, field)}")
        weights.validate()
        stack = BlockStack.from_weights(weights)
        check_stack(stack, mine, 1, "TransformerNFN input")
        return stack

    def forward_logits(self, weights: TransformerWeights) -> torch.Tensor:
        stack = self.check(weights)
        outputs = []
        for name, branch in self.branches.items():
            if name == "encoder":
                outputs.append(branch(self.encoder(stack)))
            else:
                outputs.append(branch(flat_component(weights, name)))
        return self.head(torch.cat(outputs, dim=1)).squeeze(-1)

    def forward(self, weights: TransformerWeights) -> torch.Tensor:
        """Predicted accuracy in (0, 1), shape [batch]."""
        return torch.sigmoid(self.forward_logits(weights))


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)
