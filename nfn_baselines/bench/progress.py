"""Progress of a benchmark run, measured in what it costs: network-epochs (`BenchRequest.expected_epochs`).

Two bars: the run as a whole, which moves with every epoch of every network and not only when a fit ends, so its
time estimate comes from the models' expected cost rather than from the mean of the fits so far; and, under it,
the epochs of the neural fit in progress. A fit read back from an earlier run counts at once.
"""

from __future__ import annotations

import sys
from typing import Any

from tqdm import tqdm

from small_transformer_zoo.format.architecture import ArchitectureSpec

from .request import BenchRequest


class BenchProgress:
    """Callbacks for `run_bench` (`on_epoch`, `on_done`) that drive the two bars; `close` when the run ends."""

    def __init__(self, request: BenchRequest, label: str = "bench", file: Any = None, disable: bool = False,
                 spec: ArchitectureSpec | None = None) -> None:
        self.expected = request.expected_epochs(spec)
        self.conditions = request.fit_count(spec) // max(1, len(self.expected))
        file = file or sys.stderr
        self.total = tqdm(total=sum(self.expected.values()), desc=label, unit="epoch", file=file, disable=disable,
                          position=0)
        self.fit = tqdm(total=0, desc="  fit", unit="epoch", file=file, disable=disable, position=1, leave=False)
        self._counted = 0  # epochs of the fit in progress counted so far

    def on_epoch(self, model: str, condition: str) -> None:
        if self._counted == 0:
            self.fit.reset(total=self._per_fit(model))
            self.fit.set_description_str(f"  {model} {condition}")
        self._counted += 1
        self.fit.update(1)
        self.total.update(1)

    def on_done(self, model: str, condition: str, _seeds: int) -> None:
        self.total.update(max(0, self._per_fit(model) - self._counted))  # early stopping, or a fit read back
        self.total.set_postfix_str(f"{model} {condition} done")
        self._counted = 0

    def _per_fit(self, model: str) -> int:
        return self.expected.get(model, 0) // max(1, self.conditions)

    def close(self) -> None:
        self.fit.close()
        self.total.close()
