"""Many checkpoints on the same inputs at once: the zoo's transformer (`model.ZooTransformer`) written as batched
matrix products over a batch of checkpoints in NFN layout, so that probing a zoo costs a few large kernels instead
of one small forward per checkpoint. Differentiable in the weights and in the inputs (learned probes)."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from .model import image_patches, sinusoidal_positions
from .weight_space import TransformerWeights


def _embed(weights: TransformerWeights, inputs: torch.Tensor) -> torch.Tensor:
    """Token embeddings plus positions, [B, K, L, d]."""
    spec, batch = weights.spec, weights.batch_size
    if spec.modality == "text":
        tokens = inputs.expand(batch, *inputs.shape)
    else:
        kernel = weights.embedding["embedding.patch.weight"].reshape(batch, spec.d_model, -1)
        tokens = torch.einsum("klf,bdf->bkld", image_patches(inputs, spec.patch_size), kernel)
        tokens = tokens + weights.embedding["embedding.patch.bias"][:, None, None, :]
    positions = sinusoidal_positions(spec.num_tokens, spec.d_model).to(tokens)
    return tokens + positions[: tokens.shape[2]]


def logits_on_shared_inputs(weights: TransformerWeights, inputs: torch.Tensor) -> torch.Tensor:
    """Every checkpoint's logits on every input, [B, K, classes], as `ZooTransformer` computes them one checkpoint at
    a time (eval mode, no dropout). `inputs`: images [K, C, H, W], or for a text zoo token embeddings [K, L, d]
    fed past the word table, which is not part of a checkpoint (`ZooTransformer.forward_embedded` without
    padding). Needs a one-channel weight space."""
    if weights.channels != 1:
        raise ValueError(f"only a one-channel weight space runs as networks, this has {weights.channels}")
    spec, batch = weights.spec, weights.batch_size
    h, d, dk = spec.num_heads, spec.d_model, spec.d_head
    x = _embed(weights, inputs.to(weights.blocks[0].W_q.dtype))
    k, length = x.shape[1], x.shape[2]
    for block in weights.blocks:
        w = block.map(lambda t: t.squeeze(1))
        # [B, d, 3 h dk]: the three projections in one product; heads in the NFN layout's order.
        qkv_weight = torch.cat([t.permute(0, 2, 1, 3).reshape(batch, d, h * dk) for t in (w.W_q, w.W_k, w.W_v)], -1)
        qkv = torch.bmm(F.layer_norm(x, (d,)).reshape(batch, k * length, d), qkv_weight)
        q, key, value = qkv.view(batch * k, length, 3, h, dk).permute(2, 0, 3, 1, 4).unbind(0)
        attended = F.scaled_dot_product_attention(q, key, value)  # [B K, h, L, dk]
        attended = attended.transpose(1, 2).reshape(batch, k * length, h * dk)
        y = torch.bmm(attended, w.W_o.reshape(batch, h * dk, d))
        hidden = F.relu(torch.baddbmm(w.b_A[:, None, :], F.layer_norm(y, (d,)), w.W_A))
        x = torch.baddbmm(w.b_B[:, None, :], hidden, w.W_B).view(batch, k, length, d)
    pooled = F.layer_norm(x, (d,)).mean(dim=2)
    c = weights.classifier

    def linear(x: torch.Tensor, layer: str) -> torch.Tensor:
        weight, bias = c[f"classifier.{layer}.weight"], c[f"classifier.{layer}.bias"]
        return torch.baddbmm(bias[:, None, :], x, weight.transpose(1, 2))

    return linear(F.relu(linear(pooled, "fc1")), "fc2")
