"""What a checkpoint computes, summarised: its outputs on fixed random probe inputs (docs/design.md section 9).

Every element of the symmetry group leaves the network's function unchanged, so its outputs on any input are
invariant by construction, whatever the group does to the weights. The probes are data-free and the same for every
checkpoint and every predictor seed: seeded Gaussian images in the task's normalised pixel space (vision), or seeded
Gaussian token embeddings fed past the frozen word table (text, whose table is not part of a checkpoint). The
statistics of a checkpoint's logits and class probabilities over the probes are its features, so their number does
not grow with the probe count.
"""

from __future__ import annotations

import threading
from functools import lru_cache

import torch
from torch import nn
from torch.func import functional_call

from small_transformer_zoo.format.architecture import ArchitectureSpec
from small_transformer_zoo.weights.model import ZooTransformer
from small_transformer_zoo.weights.weight_space import TransformerWeights

PROBES = 256
PROBE_SEED = 0


def probe_inputs(spec: ArchitectureSpec, count: int = PROBES, seed: int = PROBE_SEED,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Seeded Gaussian probes: images [count, C, H, W] (vision) or token embeddings [count, L, d_model] (text)."""
    generator = torch.Generator().manual_seed(seed)
    if spec.modality == "vision":
        shape = (count, spec.in_channels, spec.image_size, spec.image_size)
    else:
        shape = (count, spec.num_tokens, spec.d_model)
    return torch.randn(shape, generator=generator).to(dtype)


class _Probed(nn.Module):
    """The zoo network seen from its probes: images through the whole network, token embeddings past the word
    table."""

    def __init__(self, spec: ArchitectureSpec) -> None:
        super().__init__()
        self.network = ZooTransformer(spec)
        self.embedded = spec.modality == "text"

    def forward(self, probes: torch.Tensor) -> torch.Tensor:
        return self.network.forward_embedded(probes) if self.embedded else self.network(probes)


def probed_network(spec: ArchitectureSpec, dtype: torch.dtype, device: torch.device) -> _Probed:
    """The network every checkpoint's weights are passed to (`functional_call`), made once per spec, dtype, device
    and thread (`functional_call` swaps the module's tensors while it runs); making it draws its default
    initialisation from a forked generator, so the caller's random stream is the same whether it was made before
    or not, and no draw happens inside a vmap."""
    return _probed_network(spec, dtype, torch.device(device), threading.get_ident())


@lru_cache(maxsize=16)
def _probed_network(spec: ArchitectureSpec, dtype: torch.dtype, device: torch.device, thread: int) -> _Probed:
    with torch.random.fork_rng(devices=[]):
        return _Probed(spec).to(device=device, dtype=dtype).eval()


def probe_logits(weights: TransformerWeights, probes: torch.Tensor) -> torch.Tensor:
    """Every checkpoint's logits on every probe: [batch, probes, classes], in the weights' dtype."""
    dtype = weights.blocks[0].W_q.dtype
    probed = probed_network(weights.spec, dtype, probes.device)
    state = {f"network.{name}": tensor for name, tensor in weights.to_state_dicts().items()}
    probes = probes.to(dtype)

    with torch.no_grad():  # one checkpoint at a time: vmap has no batching rule for CPU attention kernels
        logits = [functional_call(probed, {k: v[i] for k, v in state.items()}, (probes,), strict=False)
                  for i in range(weights.batch_size)]
    return torch.stack(logits) if logits else probes.new_zeros(0, len(probes), weights.spec.num_classes)


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
