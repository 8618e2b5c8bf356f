"""Many zoo models in one step: the zoo transformer's forward pass over parameters stacked as [models, ...], and
the four optimizers applied to all models at once with per-model learning rates and weight decay.

Every linear layer is one batched matmul over the models (`torch.bmm`), so a group of runs costs a few large
kernels instead of many small ones. The update rules are torch.optim's (SGD, SGD with momentum 0.9, Adam
(0.9, 0.999), RMSprop (alpha 0.99), eps 1e-8, weight decay added to the gradient); a test checks them, and the
whole trainer, against torch.optim and `ZooTransformer` run one model at a time.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from small_transformer_zoo.format.architecture import ArchitectureSpec
from small_transformer_zoo.format.metadata import OPTIMIZERS
from small_transformer_zoo.weights.model import image_patches


HASH_MASK = 0xFFFFFFFF


# The attention kernels a group may use. cuDNN's is left out: on an H200 its bf16 backward pass fails for the
# batch of a large group (M * B sequences: "mha_graph.execute ... is_good()"); the memory-efficient kernel and the
# plain one compute the same attention.
ATTENTION_BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixing function (lowbias32-style, multipliers below 2**31 so that int64 never overflows)
    applied element-wise to int64 values in [0, 2**32): the same bits on every device."""
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & HASH_MASK
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & HASH_MASK
    return x ^ (x >> 15)


class GroupDropout:
    """Inverted dropout for M models, each with its own rate and random stream; one step's masks for every site.

    Masks come from 16-bit random lanes: a model drops an element with probability round(p * 65536) / 65536 and
    scales what it keeps by `scale`, the inverse of the keep probability, so each layer's expected output is
    unchanged as with `nn.Dropout`. The masks stay boolean; `batched_logits` folds the scale into the (small)
    weights of the layer before each dropout site, which is the same function and saves a float mask per element.

    Two sources of lanes, both per model, so a model's masks never depend on its group:
    - `draw(shape)`: each model's own CPU generator, four lanes per 64-bit draw (cheapest on a CPU). Models with
      rate 0 draw nothing, so their random streams are the same as with no dropout at all.
    - `draw(shape, step_seeds)`: a counter-based hash of each model's seed for this step (drawn per epoch from its
      generator) and the element's index, two lanes per hash; one set of element-wise kernels for the whole group,
      the way for accelerators, where one generator call per model and step would cost a kernel launch each.
    """

    def __init__(self, rates: list[float], generators: list[torch.Generator], sites: int,
                 device: torch.device | str = "cpu") -> None:
        levels = [round(p * 65536) for p in rates]
        self.generators, self.sites, self.device = generators, sites, torch.device(device)
        self.drawing = [m for m, level in enumerate(levels) if level > 0]
        self.threshold = torch.tensor([level - 32768 for level in levels], dtype=torch.int16, device=device)[:, None]
        self.level = torch.tensor(levels, dtype=torch.int64, device=device)[:, None]
        self.scale = torch.tensor([65536 / (65536 - level) for level in levels], device=device)
        self.keep: torch.Tensor | None = None
        self._counters: torch.Tensor | None = None

    def draw(self, shape: tuple[int, ...], step_seeds: torch.Tensor | None = None,
             stepping: list[bool] | None = None) -> None:
        """New boolean keep masks [M, sites, *shape] for the next step (`step_seeds` [M] int64: the hashed source).
        `stepping` [M]: the models that train this step; from its generator, a model draws masks only for its own
        steps, so its stream does not depend on how many steps the longest run of its group takes."""
        if not self.drawing:
            return
        count = self.sites * math.prod(shape)
        models = len(self.generators)
        if step_seeds is not None:
            pairs = -(-count // 2)
            if self._counters is None or len(self._counters) != pairs:
                self._counters = hash32(torch.arange(pairs, dtype=torch.int64, device=self.device))
            mixed = hash32(self._counters ^ step_seeds[:, None])
            lanes = torch.stack([mixed & 0xFFFF, mixed >> 16], -1).view(models, -1)[:, :count]
            self.keep = (lanes >= self.level).view(models, self.sites, *shape)
            return
        # Rows of rate-0 models (and of models past their last step) stay as allocated: a rate-0 model's threshold
        # (-32768) keeps every element whatever the bits, and a model past its last step does not train.
        words = torch.empty(models, -(-count // 4), dtype=torch.int64)
        for m in self.drawing:
            if stepping is None or stepping[m]:
                torch.randint(-2**63, 2**63 - 1, words.shape[1:], generator=self.generators[m], out=words[m])
        lanes = words.view(torch.int16)[:, :count]
        self.keep = (lanes >= self.threshold.cpu()).view(models, self.sites, *shape).to(self.device)

    def scaled(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` [M, ...] times each model's keep scale (unchanged when no model drops anything this step)."""
        if self.keep is None:
            return tensor
        return tensor * self.scale.to(tensor.dtype).view(-1, *[1] * (tensor.ndim - 1))

    def __call__(self, x: torch.Tensor, site: int) -> torch.Tensor:
        """Zero the dropped elements of `x` (already scaled through `scaled`) at one site."""
        return x if self.keep is None else torch.where(self.keep[:, site], x, 0.0)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, N, in] @ weight[M, out, in]^T (+ bias [M, out]).

    A batch of one model is computed as a batch of two (the second all zeros): the backward pass of a one-matrix
    `bmm` takes another kernel than that of a batch, whose rounding differs, and a run must train to the same bits
    whatever group it is in (a group of one included)."""
    if x.shape[0] == 1:
        pad = lambda t: torch.cat([t, torch.zeros_like(t)])  # noqa: E731
        return _linear(pad(x), pad(weight), None if bias is None else pad(bias))[:1]
    if bias is None:
        return torch.bmm(x, weight.transpose(1, 2))
    return torch.baddbmm(bias[:, None, :], x, weight.transpose(1, 2))


def batched_logits(spec: ArchitectureSpec, params: dict[str, torch.Tensor], inputs: torch.Tensor,
                   positions: torch.Tensor, dropout: GroupDropout | None = None,
                   embedding_table: torch.Tensor | None = None) -> torch.Tensor:
    """Logits [M, B, classes] of M models on their own inputs [M, B, ...] (images, or token ids with 0 = padding).

    `dropout` applies each model's dropout at the `2 * num_blocks + 1` dropout sites (after the embedding, and
    after each block's attention and MLP); each site's preceding layer is scaled by `dropout.scaled`.
    """
    m, b = inputs.shape[:2]
    d = spec.d_model
    scaled = dropout.scaled if dropout is not None else (lambda tensor: tensor)
    padding = None
    if spec.modality == "vision":
        w = params["embedding.patch.weight"].reshape(m, d, -1)
        patches = image_patches(inputs, spec.patch_size).flatten(1, 2)  # [M, B * tokens, C * p * p]
        tokens = _linear(patches, scaled(w), scaled(params["embedding.patch.bias"])).view(m, b, -1, d)
        x = tokens + scaled(positions.expand(m, *positions.shape))[:, None, : tokens.shape[2]]
    else:
        padding = inputs.eq(0)
        x = scaled(F.embedding(inputs, embedding_table) + positions[: inputs.shape[2]])
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
            # [M * B, heads, length, d_head] as a strided view: the attention kernel reads it without a copy.
            return _linear(flat, params[f"{pre}.attn.{name}.weight"]).view(m * b, length, h, dk).transpose(1, 2)

        with sdpa_kernel(ATTENTION_BACKENDS):
            attended = F.scaled_dot_product_attention(heads("q_proj"), heads("k_proj"), heads("v_proj"),
                                                      attn_mask=attention_keep)
        attended = attended.transpose(1, 2).reshape(m, b * length, h * dk)
        y = _linear(attended, scaled(params[f"{pre}.attn.o_proj.weight"])).view(m, b, length, d)
        if dropout is not None:
            y = dropout(y, 1 + 2 * i)
        z = F.layer_norm(y, (d,)).reshape(m, b * length, d)
        z = _linear(F.relu(_linear(z, params[f"{pre}.mlp.fc1.weight"], params[f"{pre}.mlp.fc1.bias"])),
                    scaled(params[f"{pre}.mlp.fc2.weight"]), scaled(params[f"{pre}.mlp.fc2.bias"])).view(m, b, length, d)
        x = dropout(z, 2 + 2 * i) if dropout is not None else z
    x = F.layer_norm(x, (d,))
    if padding is None:
        pooled = x.mean(dim=2)
    else:
        keep = (~padding).to(x.dtype)[..., None]
        pooled = (x * keep).sum(dim=2) / keep.sum(dim=2).clamp_min(1.0)
    hidden = F.relu(_linear(pooled, params["classifier.fc1.weight"], params["classifier.fc1.bias"]))
    return _linear(hidden, params["classifier.fc2.weight"], params["classifier.fc2.bias"])


def packed_views(spec: ArchitectureSpec, packed: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each tensor of M models as a view [M, *shape] into their packed rows [M, n_params].

    Training keeps the rows as the one leaf tensor: autograd gathers every gradient into one [M, n_params]
    tensor, and the optimizer, the divergence check and checkpointing each touch one tensor instead of 22.
    """
    sizes = [info.numel for info in spec.parameters()]
    pieces = packed.split(sizes, dim=1)
    return {info.name: piece.view(packed.shape[0], *info.shape) for info, piece in zip(spec.parameters(), pieces)}


class VectorizedOptimizer:
    """One optimizer kind for M models: `params` [M, n] is a leaf tensor, `lr` and `l2` are per model."""

    def __init__(self, kind: str, params: torch.Tensor, l2: torch.Tensor) -> None:
        if kind not in OPTIMIZERS:
            raise ValueError(f"unknown optimizer {kind!r}")
        self.kind, self.params, self.l2 = kind, params, l2.to(params.device, params.dtype)[:, None]
        names = {"sgd": (), "sgd_momentum": ("momentum",), "adam": ("m", "v"), "rmsprop": ("sq",)}[kind]
        # Zero state gives torch's first step exactly: buf = grad, m = 0.1 grad, ...
        self.state = {name: torch.zeros_like(params) for name in names}
        self.steps = torch.zeros(len(l2), dtype=torch.long, device=params.device)

    @torch.no_grad()
    def step(self, lr: torch.Tensor, active: torch.Tensor) -> None:
        """Update models where `active` [M] is true with their learning rate `lr` [M]; others stay as they are."""
        self.steps += active.long()
        on = active[:, None]
        param, state = self.params, self.state
        grad = param.grad + self.l2 * param
        if self.kind == "sgd":
            update = grad
        elif self.kind == "sgd_momentum":
            state["momentum"] = torch.where(on, 0.9 * state["momentum"] + grad, state["momentum"])
            update = state["momentum"]
        elif self.kind == "adam":
            t = self.steps.clamp_min(1).to(torch.float64)
            bias1 = (1 - 0.9 ** t).to(param.dtype)[:, None]
            bias2_root = (1 - 0.999 ** t).sqrt().to(param.dtype)[:, None]
            state["m"] = torch.where(on, state["m"].lerp(grad, 0.1), state["m"])
            state["v"] = torch.where(on, state["v"] * 0.999 + 0.001 * grad * grad, state["v"])
            update = (state["m"] / bias1) / (state["v"].sqrt() / bias2_root + 1e-8)
        else:
            state["sq"] = torch.where(on, state["sq"] * 0.99 + 0.01 * grad * grad, state["sq"])
            update = grad / (state["sq"].sqrt() + 1e-8)
        param.sub_(torch.where(on, lr.to(param.dtype)[:, None] * update, 0.0))
