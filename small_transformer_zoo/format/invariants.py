"""What every zoo holds true beyond its file hashes, in one list that both sides use: `ZooWriter` refuses a row
that breaks an invariant, and the read paths check each one where it costs least. A zoo re-signed by another tool
(its manifest rewritten to match bad files) is then refused on read as the writer would have refused it.

| invariant | the writer | reads |
|---|---|---|
| finite weights unless the checkpoint is marked diverged | `ZooWriter.add` | wherever rows are checked against their digests: `stz verify`, "always", and "once" the first time a version of the files is read |
| one best checkpoint per run | `ZooWriter.close` | every read of a split's metadata, every mode |
| one checkpoint id in the whole zoo | `ZooWriter.add` | within a split: every read; across splits: `stz verify` and "always" |
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np

from ..errors import ZooDamagedError

INVARIANTS = ("finite weights unless the checkpoint is marked diverged", "one best checkpoint per run",
              "one checkpoint id in the whole zoo")


def finite_unless_diverged(block: np.ndarray, diverged: Sequence[bool], checkpoint_ids: Sequence[str], where: str,
                           error: type[Exception] = ZooDamagedError) -> None:
    """Rows of `block` [rows, n_params] whose checkpoint is not marked diverged hold finite weights only."""
    finite = np.isfinite(block).all(axis=1)
    bad = np.nonzero(~finite & ~np.asarray(diverged, dtype=bool))[0]
    if bad.size:
        raise _error(error, where, f"the weights of checkpoint {checkpoint_ids[int(bad[0])]!r} contain NaN or inf, "
                                   f"and it is not marked diverged")


def one_best_per_run(run_ids: Sequence[str], is_best: Sequence[bool], where: str,
                     error: type[Exception] = ZooDamagedError) -> None:
    """No run has two rows marked `is_best`."""
    counts = Counter(run for run, best in zip(run_ids, is_best) if best)
    twice = next((run for run, n in counts.items() if n > 1), None)
    if twice is not None:
        raise _error(error, where, f"run {twice!r} has {counts[twice]} checkpoints marked is_best; a run has one best "
                                   f"checkpoint")


def new_checkpoint_id(seen: set[str], checkpoint_id: str, where: str, error: type[Exception] = ZooDamagedError) -> None:
    """`checkpoint_id` is not among the ids `seen` so far (the writer's check, row by row)."""
    if checkpoint_id in seen:
        raise _error(error, where, f"checkpoint_id {checkpoint_id!r} was already added; a checkpoint id occurs once "
                                   f"in a zoo")


def one_id_across_splits(ids_by_split: Mapping[str, Sequence[str]], where: str,
                         error: type[Exception] = ZooDamagedError) -> None:
    """No checkpoint id occurs in two splits."""
    seen: dict[str, str] = {}
    for split, ids in ids_by_split.items():
        for checkpoint in ids:
            if checkpoint in seen and seen[checkpoint] != split:
                raise _error(error, where, f"checkpoint_id {checkpoint!r} occurs in splits {seen[checkpoint]!r} and "
                                           f"{split!r}; a checkpoint is in one split")
            seen.setdefault(checkpoint, split)


def _error(error: type[Exception], where: str, problem: str) -> Exception:
    return error(where, problem) if issubclass(error, ZooDamagedError) else error(f"{where}: {problem}")
