"""The Transformer-NFN model (docs/design.md section 8): an invariant encoder branch plus MLP branches, predicting accuracy.

encoder: E (1 -> c) [-> ReLU -> E (c -> c)]* -> ReLU -> I (c -> c) -> LayerNorm -> MLP
classifier / embedding: MLP over the flattened weights of that component
statistics (the hybrid, `statistics=True`): LayerNorm -> MLP over the invariant statistics (`invariant_stats`)
head: concatenated branch outputs -> Dropout -> Linear -> sigmoid (or the target's outputs)

Every model of the benchmark reads its input in two steps: `prepare` turns packed weights into the tensors its
learned part consumes, once per split where nothing learned comes before (the statistics), and
`forward_prepared` maps those to outputs, so the trainer computes fixed features once and can batch models.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from small_transformer_zoo.format.architecture import COMPONENTS, ArchitectureSpec
from small_transformer_zoo.weights.canonical import canonicalize_interfaces_params
from small_transformer_zoo.weights.weight_space import TransformerWeights

from .invariant_stats import feature_count, invariant_statistics
from .layers import EquivariantLayer, InvariantLayer
from .weight_stack import BlockStack, check_stack



RECIPES = ("package", "paper")


def mlp(d_in: int, hidden: int, depth: int = 2) -> nn.Sequential:
    """depth x (Linear -> ReLU)."""
    layers: list[nn.Module] = []
    for i in range(depth):
        layers += [nn.Linear(d_in if i == 0 else hidden, hidden), nn.ReLU()]
    return nn.Sequential(*layers)


def normed_head(d_in: int, hidden: int) -> nn.Sequential:
    """The paper's encoder head: Linear, then twice LayerNorm -> ReLU -> Linear."""
    return nn.Sequential(nn.Linear(d_in, hidden), nn.LayerNorm(hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.LayerNorm(hidden), nn.ReLU(), nn.Linear(hidden, hidden))


def flat_component(weights: TransformerWeights, component: str) -> torch.Tensor:
    tensors = weights.embedding if component == "embedding" else weights.classifier
    return torch.cat([t.flatten(1) for t in tensors.values()], dim=1)


class TransformerNFNEncoder(nn.Module):
    """The G-invariant encoder branch: equivariant layers, ReLU on the MLP tensors, then the invariant layer."""

    def __init__(self, spec: ArchitectureSpec, channels: int = 10, num_layers: int = 1, reduction: str = "mean",
                 block_norm: bool = False) -> None:
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"num_layers must be at least 1, got {num_layers}")
        self.spec = spec
        self.layers = nn.ModuleList(EquivariantLayer(spec, 1 if i == 0 else channels, channels, reduction)
                                    for i in range(num_layers))
        self.invariant = InvariantLayer(spec, channels, channels, reduction, block_norm)
        self.out_features = spec.num_blocks * channels

    def equivariant(self, stack: BlockStack) -> BlockStack:
        for layer in self.layers:
            stack = layer(stack).map_mlp(torch.relu)
        return stack

    def forward(self, stack: BlockStack) -> torch.Tensor:
        *hidden, last = self.layers
        for layer in hidden:
            stack = layer(stack).map_mlp(torch.relu)
        if last.in_channels != 1:
            return self.invariant(last(stack).map_mlp(torch.relu))
        # One input channel (the paper's single layer): the invariant layer reads only summaries of the last
        # layer's output, which that layer gives without forming the output (`forward_invariant_features`).
        return self.invariant.forward_features(last.forward_invariant_features(stack))


class TransformerNFN(nn.Module):
    """Predicts a checkpoint's accuracy (a probability) from its weights, or `outputs` values of another target.

    `components` chooses what the model sees (any of encoder, embedding, classifier); the paper's setting is
    channels = hidden = 10 with one equivariant layer. `statistics=True` adds a branch over the invariant
    statistics (the hybrid); `head_dropout` drops branch outputs before the head.

    `recipe="paper"` is the authors' model term by term (docs/design.md section 8): sums over heads and indices
    instead of means, a LayerNorm per block after the invariant layer, the encoder head with its LayerNorms
    (`normed_head`), three Linear -> ReLU layers over the classifier and one Linear layer over the embedding.

    `interfaces=True` first puts the features between blocks in their canonical order
    (`canonicalize_interfaces`), so the output is invariant to the interface permutations as well as to the paper's
    group: the full symmetry group of the zoo's networks.
    """

    def __init__(self, spec: ArchitectureSpec, channels: int = 10, hidden: int = 10, num_layers: int = 1,
                 components: Sequence[str] = COMPONENTS, outputs: int = 1, head_dropout: float = 0.0,
                 statistics: bool = False, recipe: str = "package", interfaces: bool = False) -> None:
        super().__init__()
        unknown = sorted(set(components) - set(COMPONENTS))
        if unknown or not components:
            raise ValueError(f"components must be a non-empty subset of {COMPONENTS}, got {list(components)}")
        if recipe not in RECIPES:
            raise ValueError(f"unknown recipe {recipe!r}; choose from {list(RECIPES)}")
        paper = recipe == "paper"
        self.spec, self.outputs, self.statistics, self.interfaces = spec, outputs, statistics, interfaces
        self.components = tuple(c for c in spec.stored_components if c in components)
        if not self.components:
            raise ValueError(f"a {spec.modality} checkpoint holds no weights of components {list(components)} (a text "
                             f"zoo's embedding is frozen and stored once per zoo, not in its checkpoints)")
        branches = {}
        if "encoder" in self.components:
            encoder = TransformerNFNEncoder(spec, channels, num_layers, "sum" if paper else "mean", block_norm=paper)
            head = normed_head(encoder.out_features, hidden) if paper else mlp(encoder.out_features, hidden)
            branches["encoder"] = nn.Sequential(nn.LayerNorm(encoder.out_features), head)
            self.encoder = encoder
        for component in ("embedding", "classifier"):
            if component in self.components:
                size = sum(p.numel for p in spec.parameters() if spec.component(p.name) == component)
                if not paper:
                    branches[component] = mlp(size, hidden)
                else:
                    branches[component] = nn.Linear(size, hidden) if component == "embedding" else mlp(size, hidden, 3)
        if statistics:
            features = feature_count(spec, self.components)
            branches["statistics"] = nn.Sequential(nn.LayerNorm(features), mlp(features, hidden))
        self.branches = nn.ModuleDict(branches)
        self.head = nn.Sequential(nn.Dropout(head_dropout), nn.Linear(hidden * len(branches), outputs))

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

    @torch.no_grad()
    def prepare(self, params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Packed weights [N, n_params] -> this model's inputs (`inputs`), computed once with no gradient."""
        return self.inputs(params)

    def inputs(self, params: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """The weights (their interfaces in canonical order where `interfaces`), and the statistics for the
        hybrid."""
        if self.interfaces:
            params = canonicalize_interfaces_params(params, self.spec)
        if not self.statistics:
            return (params,)
        return params, invariant_statistics(TransformerWeights.from_params(params, self.spec), self.components)

    def forward_prepared(self, params: torch.Tensor, *statistics: torch.Tensor) -> torch.Tensor:
        weights = TransformerWeights.from_params(params, self.spec)
        stack = self.check(weights)
        outputs = []
        for name, branch in self.branches.items():
            if name == "encoder":
                outputs.append(branch(self.encoder(stack)))
            elif name == "statistics":
                outputs.append(branch(statistics[0]))
            else:
                outputs.append(branch(flat_component(weights, name)))
        logits = self.head(torch.cat(outputs, dim=1))
        return logits.squeeze(-1) if self.outputs == 1 else logits

    def forward_logits(self, weights: TransformerWeights) -> torch.Tensor:
        self.check(weights)
        params = weights.to_params()
        return self.forward_prepared(*self.inputs(params))

    def forward(self, weights: TransformerWeights) -> torch.Tensor:
        """Predicted accuracy in (0, 1), shape [batch] (a single-output model)."""
        return torch.sigmoid(self.forward_logits(weights))


def count_parameters(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)
