"""Per-tensor standardisation of weight spaces that keeps the symmetry group's action intact.

Statistics come from a training split and are pooled over every index the group moves, so that standardising
commutes with the group: `standardize(g . W) = g . standardize(W)`, and an equivariant or invariant model sees
standardised weights with the same symmetry. Per block in NFN layout (docs/design.md section 7):

- W_q, W_k, W_v [h, D, D_k]: their columns carry GL(D_k), so no mean is subtracted (a shift does not commute with
  M_i); each row (the fixed input feature) is divided by its root mean square over heads and columns.
- W_o [h, D_v, D]: rows carry GL(D_v) and columns pi_O, so one root mean square for the whole tensor.
- W_A [D, D_A] and b_A [D_A]: every index permuted, so one mean and one standard deviation per tensor.
- W_B [D_A, D]: rows permuted, columns fixed: a mean and standard deviation per column. b_B [D]: per entry.
- The embedding and the classifier, which the group does not act on: per entry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .weight_space import BLOCK_TENSORS, BlockWeights, TransformerWeights

EPS = 1e-8
# Per block tensor (NFN layout after [batch, channels]): the dims pooled, and whether the mean is subtracted.
POOLING: dict[str, tuple[tuple[int, ...], bool]] = {
    "W_q": ((-3, -1), False), "W_k": ((-3, -1), False), "W_v": ((-3, -1), False), "W_o": ((-3, -2, -1), False),
    "W_A": ((-2, -1), True), "b_A": ((-1,), True), "W_B": ((-2,), True), "b_B": ((), True),
}


@dataclass
class WeightStats:
    """Shift and scale per tensor, named `blocks.<b>.<W_q..b_B>`, `embedding.<name>` or `classifier.<name>`;
    each broadcasts against its tensor without the leading [batch, channels] (or [batch]) dims."""

    shift: dict[str, torch.Tensor]
    scale: dict[str, torch.Tensor]

    @classmethod
    def of(cls, weights: TransformerWeights) -> "WeightStats":
        """Statistics of a batch of checkpoints (the training split), pooled as the module docstring says."""
        shift, scale = {}, {}
        for b, block in enumerate(weights.blocks):
            for name in BLOCK_TENSORS:
                dims, centred = POOLING[name]
                tensor = getattr(block, name).to(torch.float64)
                pooled = (0, 1, *dims)
                mean = tensor.mean(dim=pooled, keepdim=True) if centred else torch.zeros((1,) * tensor.ndim,
                                                                                        dtype=torch.float64)
                spread = (tensor - mean).pow(2).mean(dim=pooled, keepdim=True).sqrt()
                shift[f"blocks.{b}.{name}"], scale[f"blocks.{b}.{name}"] = mean[0, 0], spread[0, 0]
        for prefix, part in (("embedding", weights.embedding), ("classifier", weights.classifier)):
            for name, tensor in part.items():
                tensor = tensor.to(torch.float64)
                shift[name], scale[name] = tensor.mean(dim=0), tensor.std(dim=0, unbiased=False)
        return cls(shift, scale)

    def apply(self, weights: TransformerWeights) -> TransformerWeights:
        """(W - shift) / scale for every tensor, in the weights' dtype and device."""
        def standard(name: str, tensor: torch.Tensor) -> torch.Tensor:
            shift = self.shift[name].to(tensor)
            scale = self.scale[name].to(tensor).clamp_min(EPS)
            return (tensor - shift) / scale

        blocks = [BlockWeights(**{name: standard(f"blocks.{b}.{name}", getattr(block, name))
                                  for name in BLOCK_TENSORS}) for b, block in enumerate(weights.blocks)]
        return TransformerWeights(weights.spec, blocks,
                                  {k: standard(k, v) for k, v in weights.embedding.items()},
                                  {k: standard(k, v) for k, v in weights.classifier.items()})

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, to store beside a benchmark run."""
        return {"shift": {k: v.tolist() for k, v in self.shift.items()},
                "scale": {k: v.tolist() for k, v in self.scale.items()}}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "WeightStats":
        return cls({k: torch.tensor(v, dtype=torch.float64) for k, v in data["shift"].items()},
                   {k: torch.tensor(v, dtype=torch.float64) for k, v in data["scale"].items()})
