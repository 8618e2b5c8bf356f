"""ProbeGen (Kahana et al., "Deep Linear Probe Generators for Weight Space Learning", ICLR 2025): a network is read
through what it computes on a few probe inputs, and the probes themselves are learned.

K probes are made by a deep linear generator (linear layers, no nonlinearity) from K learned latent codes: images in
the task's normalised pixel space, or token embeddings fed past the frozen word table (text, whose table is not part
of a checkpoint), as `statnn_probe`'s fixed probes are. Every checkpoint of a batch runs on them, all checkpoints at
once (the network written as batched matrix products over the checkpoints); its class probabilities on the K
probes, concatenated, go through an MLP. Generator, codes and MLP train end to end by the package's trainer.
Every element of the symmetry group keeps a network's function, so the prediction is invariant by construction,
to float round-off.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from small_transformer_zoo.format.architecture import ArchitectureSpec
from small_transformer_zoo.weights.shared_inputs import logits_on_shared_inputs
from small_transformer_zoo.weights.weight_space import TransformerWeights

LATENT = 16
GENERATOR_WIDTH = 64


def probe_shape(spec: ArchitectureSpec) -> tuple[int, ...]:
    """One probe: an image [C, H, W], or token embeddings [tokens, d_model] past the word table."""
    if spec.modality == "vision":
        return (spec.in_channels, spec.image_size, spec.image_size)
    return (spec.num_tokens, spec.d_model)


def batched_probe_logits(weights: TransformerWeights, probes: torch.Tensor) -> torch.Tensor:
    """Every checkpoint's logits on every probe, [batch, probes, classes], differentiable in the probes and the
    weights: all checkpoints at once, as batched matrix products (attention by its plain matmul form, which has a
    batching rule when the seeds trained together are vmapped)."""
    with sdpa_kernel([SDPBackend.MATH]):
        return logits_on_shared_inputs(weights, probes)


class ProbeGen(nn.Module):
    """Learned probes, a checkpoint's outputs on them, an MLP over those (module docstring)."""

    def __init__(self, spec: ArchitectureSpec, probes: int, latent: int = LATENT, hidden: int = 128,
                 outputs: int = 1, head_dropout: float = 0.0) -> None:
        super().__init__()
        self.spec, self.shape, self.outputs = spec, probe_shape(spec), outputs
        self.codes = nn.Parameter(torch.randn(probes, latent))
        self.generator = nn.Sequential(nn.Linear(latent, GENERATOR_WIDTH), nn.Linear(GENERATOR_WIDTH, GENERATOR_WIDTH),
                                       nn.Linear(GENERATOR_WIDTH, math.prod(self.shape)))
        self.head = nn.Sequential(nn.Linear(probes * spec.num_classes, hidden), nn.ReLU(), nn.Dropout(head_dropout),
                                  nn.Linear(hidden, outputs))

    def probes(self) -> torch.Tensor:
        """The K probes the generator makes now, [K, *probe_shape]."""
        return self.generator(self.codes).view(len(self.codes), *self.shape)

    def forward_logits(self, weights: TransformerWeights) -> torch.Tensor:
        probes = self.probes().to(weights.blocks[0].W_q.dtype)
        outputs = torch.softmax(batched_probe_logits(weights, probes), dim=-1)
        logits = self.head(outputs.flatten(1).to(self.codes.dtype))
        return logits.squeeze(-1) if self.outputs == 1 else logits

    def forward(self, weights: TransformerWeights) -> torch.Tensor:
        return torch.sigmoid(self.forward_logits(weights))
