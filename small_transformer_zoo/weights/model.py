"""The zoo's transformer as a PyTorch module (docs/design.md section 2), so any checkpoint can be run.

No residual connections and LayerNorm without affine parameters: both are part of the architecture and are
what make the attention output permutation a symmetry (docs/design.md section 7).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from ..format.architecture import ArchitectureSpec


def sinusoidal_positions(num_tokens: int, d_model: int) -> torch.Tensor:
    """The fixed (untrained) sinusoidal position table, [num_tokens, d_model]."""
    position = torch.arange(num_tokens, dtype=torch.float64)[:, None]
    freq = torch.exp(torch.arange(0, d_model, 2, dtype=torch.float64) * (-math.log(10000.0) / d_model))
    table = torch.zeros(num_tokens, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq)[:, : d_model // 2]
    return table.float()


def image_patches(images: torch.Tensor, patch: int) -> torch.Tensor:
    """[..., C, H, W] -> [..., tokens, C * p * p]: the non-overlapping p x p patches `PatchEmbedding`'s convolution
    reads, each flattened in its weight order (c, kh, kw), tokens row-major; a matmul with the flattened kernel
    is the convolution, for code that runs many checkpoints' embeddings as one batched product."""
    *lead, c, height, width = images.shape
    rows, cols = height // patch, width // patch
    x = images.reshape(*lead, c, rows, patch, cols, patch)
    n = len(lead)
    x = x.permute(*range(n), n + 1, n + 3, n, n + 2, n + 4)
    return x.reshape(*lead, rows * cols, c * patch * patch)


class MultiHeadAttention(nn.Module):
    def __init__(self, spec: ArchitectureSpec) -> None:
        super().__init__()
        inner = spec.num_heads * spec.d_head
        self.num_heads, self.d_head = spec.num_heads, spec.d_head
        self.q_proj = nn.Linear(spec.d_model, inner, bias=False)
        self.k_proj = nn.Linear(spec.d_model, inner, bias=False)
        self.v_proj = nn.Linear(spec.d_model, inner, bias=False)
        self.o_proj = nn.Linear(inner, spec.d_model, bias=False)

    def forward(self, x: torch.Tensor, key_padding: torch.Tensor | None = None) -> torch.Tensor:
        batch, length, _ = x.shape

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, length, self.num_heads, self.d_head).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        keep = None if key_padding is None else ~key_padding[:, None, None, :]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # softmax(q k^T / sqrt(d_head)) v
        return self.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


class MLP(nn.Module):
    def __init__(self, d_in: int, d_hidden: int, d_out: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)))


class Block(nn.Module):
    """Y = Dropout(MHA(LN(X))); Z = Dropout(MLP(LN(Y))); no residuals, LN without affine parameters."""

    def __init__(self, spec: ArchitectureSpec, dropout: float) -> None:
        super().__init__()
        self.attn = MultiHeadAttention(spec)
        self.mlp = MLP(spec.d_model, spec.d_mlp, spec.d_model)
        self.dropout = nn.Dropout(dropout)
        self.d_model = spec.d_model

    def forward(self, x: torch.Tensor, key_padding: torch.Tensor | None = None) -> torch.Tensor:
        y = self.dropout(self.attn(F.layer_norm(x, (self.d_model,)), key_padding))
        return self.dropout(self.mlp(F.layer_norm(y, (self.d_model,))))


class PatchEmbedding(nn.Module):
    def __init__(self, spec: ArchitectureSpec) -> None:
        super().__init__()
        self.patch = nn.Conv2d(spec.in_channels, spec.d_model, spec.patch_size, stride=spec.patch_size)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.patch(images).flatten(2).transpose(1, 2)


class FrozenWordEmbedding(nn.Module):
    """Frozen table shared by every run of a text zoo; a buffer, so it stays out of per-checkpoint state_dicts."""

    def __init__(self, spec: ArchitectureSpec) -> None:
        super().__init__()
        self.register_buffer("table", torch.zeros(spec.vocab_size, spec.d_model), persistent=False)

    def forward(self, token_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(token_ids, self.table)


class ZooTransformer(nn.Module):
    """The zoo model; `forward` takes images [B, C, H, W] (vision) or token ids [B, L] with 0 = padding (text)."""

    def __init__(self, spec: ArchitectureSpec, dropout: float = 0.0) -> None:
        super().__init__()
        self.spec = spec
        self.embedding = PatchEmbedding(spec) if spec.modality == "vision" else FrozenWordEmbedding(spec)
        self.register_buffer("positions", sinusoidal_positions(spec.num_tokens, spec.d_model), persistent=False)
        self.input_dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(spec, dropout) for _ in range(spec.num_blocks))
        self.classifier = MLP(spec.d_model, spec.d_model, spec.num_classes)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        padding = inputs.eq(0) if self.spec.modality == "text" else None
        return self.forward_embedded(self.embedding(inputs), padding)

    def forward_embedded(self, tokens: torch.Tensor, padding: torch.Tensor | None = None) -> torch.Tensor:
        """Logits from token embeddings [B, L, d_model] (`padding`: [B, L], True where a token is padding): the
        network after its embedding, so that a text model runs without its frozen word table."""
        x = self.input_dropout(tokens + self.positions[: tokens.shape[1]])
        # A text of padding only would leave no key to attend to; let it attend to its padding instead of NaN.
        attention_padding = None if padding is None else padding & ~padding.all(dim=1, keepdim=True)
        for block in self.blocks:
            x = block(x, attention_padding)
        x = F.layer_norm(x, (self.spec.d_model,))
        if padding is None:
            pooled = x.mean(dim=1)
        else:
            keep = (~padding).to(x.dtype)[..., None]
            pooled = (x * keep).sum(dim=1) / keep.sum(dim=1).clamp_min(1.0)
        return self.classifier(pooled)
