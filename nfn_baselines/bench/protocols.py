"""The benchmark's protocols, by name (docs/design.md section 10; `bench_data` carries them out).

- `all-checkpoints` (the default): every selected checkpoint of the training split is a training example; tau
  above an accuracy threshold is measured on the test checkpoints above it.
- `paper`: the protocol of the paper's Table 1. One checkpoint per run, the one saved after a given epoch (by
  default the epoch that plays the role of the paper's 75 of 100 epochs: three quarters of the zoo's training), and
  for each accuracy threshold the zoo is filtered first, then trained, selected and tested on what passed, within
  the zoo's own run splits (the original code's `cut_off`, without its per-file shuffle).

`protocol_where` turns a protocol and a `where` into the one metadata selection that both the benchmark's loader
and the scorer apply, so a submission written under a protocol is checked against the checkpoints it was made for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from small_transformer_zoo.errors import DataError

if TYPE_CHECKING:
    from small_transformer_zoo import Zoo

PROTOCOLS = ("all-checkpoints", "paper")
PAPER_EPOCH_SHARE = 0.75  # the paper's epoch 75 of 100


def paper_epoch(zoo: Zoo) -> int:
    """The epoch that plays the role of the paper's 75 of 100: three quarters of a built zoo's training (an epoch
    its checkpoints include), 75 for an imported release."""
    plan = (zoo.manifest.get("provenance") or {}).get("build_plan")
    stored = [e for e in zoo.manifest.get("checkpoint_epochs") or [] if isinstance(e, int)]
    if isinstance(plan, dict) and isinstance(plan.get("epochs"), int):
        epoch = max(1, round(plan["epochs"] * PAPER_EPOCH_SHARE))
    elif 75 in stored:
        epoch = 75
    else:
        raise DataError(f"{zoo.dir}: neither a built zoo nor one with epoch-75 checkpoints; choose the epoch of the "
                        f"paper protocol with --epoch (stored epochs: {stored})")
    if stored and epoch not in stored:
        raise DataError(f"{zoo.dir}: the paper protocol's epoch {epoch} is not among the stored epochs {stored}; "
                        f"choose one with --epoch")
    return epoch


def protocol_where(zoo: Zoo | None, protocol: str = "all-checkpoints", epoch: int | None = None,
                   where: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], int | None]:
    """The metadata selection (`Zoo.select`'s `where`) of a protocol over `where`, and the protocol's epoch: the
    paper protocol adds its epoch (the zoo's `paper_epoch` unless given) and leaves out the copied best
    checkpoints."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"unknown protocol {protocol!r}; choose from {list(PROTOCOLS)}")
    selection = dict(where or {})
    if protocol == "paper":
        if epoch is None and zoo is None:
            raise ValueError("the paper protocol needs its epoch, or the zoo to find it in")
        epoch = paper_epoch(zoo) if epoch is None else epoch
        if "epoch" in selection:
            raise ValueError("the paper protocol selects the epoch itself (--epoch); leave 'epoch' out of where")
        selection |= {"epoch": epoch, "is_best": False}
    elif epoch is not None:
        raise ValueError("--epoch belongs to the paper protocol (--protocol paper); select epochs with --where")
    return selection, epoch
