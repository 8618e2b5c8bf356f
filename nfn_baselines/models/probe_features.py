"""What a checkpoint computes, summarised: its outputs on fixed random probe inputs (docs/design.md section 9).

Every element of the symmetry group leaves the network's function unchanged, so its outputs on any input are
invariant by construction, whatever the group does to the weights. The probes are data-free and the same for every
checkpoint and every predictor seed: seeded Gaussian images in the task's normalised pixel space (vision), or seeded
Gaussian token embeddings fed past the frozen word table (text, whose table is not part of a checkpoint). The
statistics of a checkpoint's logits and class probabilities over the probes are its features, so their number does
not grow with the probe count.
"""

from __future__ import annotations

import torch

from small_transformer_zoo.format.architecture import ArchitectureSpec
from small_transformer_zoo.weights.shared_inputs import logits_on_shared_inputs
from small_transformer_zoo.weights.weight_space import TransformerWeights

PROBES = 256
PROBE_SEED = 0
PROBE_CHUNK = 4  # checkpoints per batched forward: 4 x 256 probes keep its largest activation near 20 MB


def probe_inputs(spec: ArchitectureSpec, count: int = PROBES, seed: int = PROBE_SEED,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Seeded Gaussian probes: images [count, C, H, W] (vision) or token embeddings [count, L, d_model] (text)."""
    generator = torch.Generator().manual_seed(seed)
    if spec.modality == "vision":
        shape = (count, spec.in_channels, spec.image_size, spec.image_size)
    else:
        shape = (count, spec.num_tokens, spec.d_model)
    return torch.randn(shape, generator=generator).to(dtype)


def probe_logits(weights: TransformerWeights, probes: torch.Tensor, chunk: int = PROBE_CHUNK) -> torch.Tensor:
    """Every checkpoint's logits on every probe: [batch, probes, classes], in the weights' dtype; `chunk`
    checkpoints at a time through the batched forward, so that memory stays bounded whatever the batch."""
    with torch.no_grad():
        parts = [logits_on_shared_inputs(weights.map(lambda t: t[i : i + chunk]), probes)
                 for i in range(0, weights.batch_size, chunk)]
    return torch.cat(parts) if parts else probes.new_zeros(0, len(probes), weights.spec.num_classes)


def output_statistics(logits: torch.Tensor) -> torch.Tensor:
    """[batch, probes, C] logits -> [batch, 2 C + 5]: the mean of the sorted class probabilities (top class first),
    the mean probability of each class, the mean and spread of the entropy and of the top-two margin, and the mean
    spread of the logits."""
    probabilities = torch.softmax(logits, -1)
    ranked = probabilities.sort(-1, descending=True).values
    entropy = -(probabilities * probabilities.clamp_min(1e-30).log()).sum(-1)
    margin = ranked[..., 0] - ranked[..., 1] if logits.shape[-1] > 1 else ranked[..., 0]
    spread = logits.std(-1, unbiased=False)
    return torch.cat([ranked.mean(1), probabilities.mean(1),
                      torch.stack([entropy.mean(1), entropy.std(1, unbiased=False), margin.mean(1),
                                   margin.std(1, unbiased=False), spread.mean(1)], dim=-1)], dim=-1)


def output_feature_count(spec: ArchitectureSpec) -> int:
    return 2 * spec.num_classes + 5


def probe_statistics(weights: TransformerWeights, count: int = PROBES) -> torch.Tensor:
    """[batch, output_feature_count(spec)]: the output statistics of every checkpoint on the standard probes."""
    reference = weights.blocks[0].W_q
    probes = probe_inputs(weights.spec, count, dtype=reference.dtype).to(reference.device)
    return output_statistics(probe_logits(weights, probes))
