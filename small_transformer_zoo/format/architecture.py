"""The zoo architecture as data: dimensions, parameter names, shapes and the packed-row layout.

Every checkpoint of a zoo is one row of `n_params` float32 values; `ArchitectureSpec.parameters()` says which
slice of that row is which tensor, in the order of the PyTorch module tree of `small_transformer_zoo.weights.model`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal

COMPONENTS = ("encoder", "embedding", "classifier")  # the three parts of every zoo model, in table order

Modality = Literal["vision", "text"]


@dataclass(frozen=True)
class ParameterInfo:
    """One tensor of a checkpoint: its state_dict name, PyTorch shape and place in the packed row."""

    name: str
    shape: tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "offset": self.offset}


# Bounds on every dimension, far above any zoo's, so that a damaged manifest cannot ask for a model of 10^40 blocks.
DIMENSION_LIMITS = {"num_classes": 1 << 16, "d_model": 1 << 14, "num_heads": 1 << 10, "d_head": 1 << 14,
                    "d_mlp": 1 << 16, "num_blocks": 1 << 10, "image_size": 1 << 14, "in_channels": 1 << 10,
                    "patch_size": 1 << 14, "vocab_size": 1 << 24, "max_length": 1 << 20}


@dataclass(frozen=True)
class ArchitectureSpec:
    """Dimensions of one zoo's transformer (docs/design.md section 2); the defaults are the paper's."""

    modality: Modality
    num_classes: int
    d_model: int = 32
    num_heads: int = 2
    d_head: int = 16
    d_mlp: int = 64
    num_blocks: int = 2
    image_size: int = 28
    in_channels: int = 1
    patch_size: int = 4
    vocab_size: int = 0
    max_length: int = 0

    def __post_init__(self) -> None:
        if self.modality not in ("vision", "text"):
            raise ValueError(f"architecture field 'modality' must be 'vision' or 'text', got {self.modality!r}")
        for name, limit in DIMENSION_LIMITS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= limit:
                raise ValueError(f"architecture field {name!r} must be a whole number from 0 to {limit:,}, "
                                 f"got {value!r}")
        needed = ("num_classes", "d_model", "num_heads", "d_head", "d_mlp", "num_blocks")
        needed += ("image_size", "in_channels", "patch_size") if self.modality == "vision" else ()
        for name in needed:
            if getattr(self, name) < 1:
                raise ValueError(f"architecture field {name!r} must be positive, got {getattr(self, name)!r}")
        if self.modality == "vision" and self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} is not a multiple of patch_size {self.patch_size}")
        if self.modality == "text" and (self.vocab_size < 2 or self.max_length < 1):
            raise ValueError(f"a text architecture needs vocab_size >= 2 and max_length >= 1, "
                             f"got vocab_size={self.vocab_size}, max_length={self.max_length}")

    @property
    def num_tokens(self) -> int:
        """Sequence length seen by the encoder: patches for images, padded length for text."""
        if self.modality == "vision":
            return (self.image_size // self.patch_size) ** 2
        return self.max_length

    def _shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        d, inner, a = self.d_model, self.num_heads * self.d_head, self.d_mlp
        shapes: list[tuple[str, tuple[int, ...]]] = []
        if self.modality == "vision":
            p = self.patch_size
            shapes += [("embedding.patch.weight", (d, self.in_channels, p, p)), ("embedding.patch.bias", (d,))]
        for b in range(self.num_blocks):
            pre = f"blocks.{b}"
            shapes += [
                (f"{pre}.attn.q_proj.weight", (inner, d)),
                (f"{pre}.attn.k_proj.weight", (inner, d)),
                (f"{pre}.attn.v_proj.weight", (inner, d)),
                (f"{pre}.attn.o_proj.weight", (d, inner)),
                (f"{pre}.mlp.fc1.weight", (a, d)),
                (f"{pre}.mlp.fc1.bias", (a,)),
                (f"{pre}.mlp.fc2.weight", (d, a)),
                (f"{pre}.mlp.fc2.bias", (d,)),
            ]
        shapes += [
            ("classifier.fc1.weight", (d, d)),
            ("classifier.fc1.bias", (d,)),
            ("classifier.fc2.weight", (self.num_classes, d)),
            ("classifier.fc2.bias", (self.num_classes,)),
        ]
        return shapes

    def parameters(self) -> list[ParameterInfo]:
        """Trainable tensors in packed-row order, with their offsets."""
        out, offset = [], 0
        for name, shape in self._shapes():
            info = ParameterInfo(name, shape, offset)
            out.append(info)
            offset += info.numel
        return out

    @property
    def n_params(self) -> int:
        last = self.parameters()[-1]
        return last.offset + last.numel

    def component(self, name: str) -> str:
        """Which of `COMPONENTS` a parameter belongs to."""
        head = name.split(".", 1)[0]
        return {"embedding": "embedding", "blocks": "encoder", "classifier": "classifier"}[head]

    @property
    def stored_components(self) -> tuple[str, ...]:
        """The components a checkpoint holds weights of, in `COMPONENTS` order: all three for vision; encoder and
        classifier for text, whose word embedding is frozen and stored once per zoo."""
        held = {self.component(p.name) for p in self.parameters()}
        return tuple(c for c in COMPONENTS if c in held)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ArchitectureSpec":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown architecture fields {unknown}")
        return cls(**data)


def mnist_spec() -> ArchitectureSpec:
    """The paper's vision zoo: 28x28 grey images, 10 classes, 18,506 parameters."""
    return ArchitectureSpec(modality="vision", num_classes=10)


def text_spec(vocab_size: int, max_length: int, num_classes: int = 4) -> ArchitectureSpec:
    """The paper's text zoo (AG News: 4 classes); the frozen embedding is stored once per zoo."""
    return ArchitectureSpec(modality="text", num_classes=num_classes, vocab_size=vocab_size, max_length=max_length)
