"""Many zoo models in one step: the zoo transformer's forward pass over parameters stacked as [models, ...], and
the four optimizers applied to all models at once with per-model learning rates and weight decay.

Every linear layer is one batched matmul over the models (`torch.bmm`), so a group of runs costs a few large
kernels instead of many small ones. The update rules are torch.optim's (SGD, SGD with momentum 0.9, Adam
(0.9, 0.999), RMSprop (alpha 0.99), eps 1e-8, weight decay added to the gradient); a test checks them, and the
whole trainer, against torch.optim and `ZooTransformer` run one model at a time.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.nn import functional as F

from small_transformer_zoo.architecture import ArchitectureSpec

Dropout = Callable[[torch.Tensor, int], torch.Tensor]


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, N, in] @ weight[M, out, in]^T (+ bias [M, out])."""
    if bias is None:
        return torch.bmm(x, weight.transpose(1, 2))
    return torch.baddbmm(bias[:, None, :], x, weight.transpose(1, 2))


def _patches(images: torch.Tensor, spec: ArchitectureSpec) -> torch.Tensor:
    """[M, B, C, H, W] -> [M, B * tokens, C * p * p] in Conv2d weight order (c, kh, kw), tokens row-major."""
    m, b, c, height, width = images.shape
    p = spec.patch_size
    gh, gw = height // p, width // p
    x = images.reshape(m, b, c, gh, p, gw, p).permute(0, 1, 3, 5, 2, 4, 6)
    return x.reshape(m, b * gh * gw, c * p * p)


def batched_logits(spec: ArchitectureSpec, params: dict[str, torch.Tensor], inputs: torch.Tensor,
                   positions: torch.Tensor, dropout: Dropout | None = None,
                   embedding_table: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [M, B, classes] of M models on their own inputs [M, B, ...] (images, or token ids with 0 = padding).

    `dropout(x, site)` applies each model's dropout at one of the `2 * num_blocks + 1` dropout sites.
    """
    m, b = inputs.shape[:2]
    d = spec.d_model
    padding = None
    if spec.modality == "vision":
        w = params["embedding.patch.weight"].reshape(m, d, -1)
        tokens = _linear(_patches(inputs, spec), w, params["embedding.patch.bias"]).view(m, b, -1, d)
    else:
        padding = inputs.eq(0)
        tokens = F.embedding(inputs, embedding_table)
    x = tokens + positions[: tokens.shape[2]]
    if dropout is not None:
        x = dropout(x, 0)
    length = x.shape[2]
    # Keys a query may attend to; a text of padding only attends to its padding rather than to nothing.
    attention_keep = None if padding is None else \
        (~(padding & ~padding.all(-1, keepdim=True))).reshape(m * b, 1, 1, -1)
    h, dk = spec.num_heads, spec.d_head
    for i in range(spec.num_blocks):
        pre = f"blocks.{i}"
        flat = F.layer_norm(x, (d,)).reshape(m, b * length, d)

        def heads(name: str) -> torch.Tensor:
            return _linear(flat, params[f"{pre}.attn.{name}.weight"]).view(m, b, length, h, dk).transpose(2, 3)

        q, k, v = heads("q_proj"), heads("k_proj"), heads("v_proj")
        attended = F.scaled_dot_product_attention(
            q.reshape(m * b, h, length, dk), k.reshape(m * b, h, length, dk), v.reshape(m * b, h, length, dk),
            attn_mask=attention_keep)
        attended = attended.view(m, b, h, length, dk).transpose(2, 3).reshape(m, b * length, h * dk)
        y = _linear(attended, params[f"{pre}.attn.o_proj.weight"]).view(m, b, length, d)
        if dropout is not None:
            y = dropout(y, 1 + 2 * i)
        z = F.layer_norm(y, (d,)).reshape(m, b * length, d)
        z = _linear(F.relu(_linear(z, params[f"{pre}.mlp.fc1.weight"], params[f"{pre}.mlp.fc1.bias"])),
                    params[f"{pre}.mlp.fc2.weight"], params[f"{pre}.mlp.fc2.bias"]).view(m, b, length, d)
        x = dropout(z, 2 + 2 * i) if dropout is not None else z
    x = F.layer_norm(x, (d,))
    if padding is None:
        pooled = x.mean(dim=2)
    else:
        keep = (~padding).to(x.dtype)[..., None]
        pooled = (x * keep).sum(dim=2) / keep.sum(dim=2).clamp_min(1.0)
    hidden = F.relu(_linear(pooled, params["classifier.fc1.weight"], params["classifier.fc1.bias"]))
    return _linear(hidden, params["classifier.fc2.weight"], params["classifier.fc2.bias"])


class VectorizedOptimizer:
    """One optimizer kind for M models; `lr` and `l2` are per model, parameters are [M, ...] leaf tensors."""

    def __init__(self, kind: str, params: list[torch.Tensor], l2: torch.Tensor) -> None:
        if kind not in ("sgd", "sgd_momentum", "adam", "rmsprop"):
            raise ValueError(f"unknown optimizer {kind!r}")
        self.kind, self.params, self.l2 = kind, params, l2
        names = {"sgd": (), "sgd_momentum": ("momentum",), "adam": ("m", "v"), "rmsprop": ("sq",)}[kind]
        # Zero state gives torch's first step exactly: buf = grad, m = 0.1 grad, ...
        self.state = [{name: torch.zeros_like(p) for name in names} for p in params]
        self.steps = torch.zeros(len(l2), dtype=torch.long)

    @torch.no_grad()
    def step(self, lr: torch.Tensor, active: torch.Tensor) -> None:
        """Update models where `active` [M] is true with their learning rate `lr` [M]; others stay as they are."""
        self.steps += active.long()
        t = self.steps.clamp_min(1).to(torch.float64)
        bias1, bias2_root = 1 - 0.9 ** t, (1 - 0.999 ** t).sqrt()
        for param, state in zip(self.params, self.state):
            shape = (-1,) + (1,) * (param.ndim - 1)
            on = active.view(shape)
            grad = param.grad + self.l2.view(shape).to(param.dtype) * param
            if self.kind == "sgd":
                update = grad
            elif self.kind == "sgd_momentum":
                state["momentum"] = torch.where(on, 0.9 * state["momentum"] + grad, state["momentum"])
                update = state["momentum"]
            elif self.kind == "adam":
                state["m"] = torch.where(on, state["m"].lerp(grad, 0.1), state["m"])
                state["v"] = torch.where(on, state["v"] * 0.999 + 0.001 * grad * grad, state["v"])
                b1, b2 = bias1.to(param.dtype).view(shape), bias2_root.to(param.dtype).view(shape)
                update = (state["m"] / b1) / (state["v"].sqrt() / b2 + 1e-8)
            else:
                state["sq"] = torch.where(on, state["sq"] * 0.99 + 0.01 * grad * grad, state["sq"])
                update = grad / (state["sq"].sqrt() + 1e-8)
            param.sub_(torch.where(on, lr.view(shape).to(param.dtype) * update, torch.zeros_like(param)))
