"""Progress of a benchmark run that can be trusted: the run counted in fits, the time left estimated from what
each fit is expected to cost (`benchmark.fit_cost`: epochs times rows for a neural model, a prior per training row
for trees and floors), calibrated as fits finish (each model's own rate once one of its fits has finished, else its
kind's, else the run's); under it, the phase in progress: a neural fit's epochs, a tree's boosting rounds or a
forest's trees, a feature pass over the checkpoints. A fit read back from an earlier run counts at once and calibrates
nothing.

On a terminal: two bars. Elsewhere (a log file, CI): no bar, no ANSI code and no redraw, one plain line per
finished fit.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from typing import Any, TextIO

from tqdm import tqdm

from small_transformer_zoo.format.architecture import ArchitectureSpec

from .request import BenchRequest


class BenchProgress:
    """The `progress` of `run_bench`: `plan`, `epoch`, `phase` and `done` drive it; `close` when the run ends."""

    def __init__(self, request: BenchRequest, label: str = "bench", file: TextIO | None = None,
                 disable: bool = False, spec: ArchitectureSpec | None = None) -> None:
        self.file = file or sys.stderr
        self.label = label
        self.terminal = not disable and _is_terminal(self.file)
        self.quiet = disable
        expected = request.expected_epochs(spec)
        conditions = max(1, request.fit_count(spec) // max(1, len(expected)))
        self.epochs = {model: epochs // conditions for model, epochs in expected.items()}  # per fit
        self.costs: dict[tuple[str, str], tuple[str, float]] = {}  # (model, condition) -> (kind, expected cost)
        self.finished: set[tuple[str, str]] = set()
        self.measured: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # key -> [seconds, cost]
        self.total = tqdm(total=0, desc=label, unit="fit", file=self.file, disable=not self.terminal, position=0,
                          bar_format="{desc}: {n_fmt}/{total_fmt} fits |{bar}| {elapsed} elapsed{postfix}")
        self.inner = tqdm(total=0, desc="  fit", file=self.file, disable=not self.terminal, position=1, leave=False,
                          bar_format="{desc}: {n_fmt}/{total_fmt} |{bar}| {rate_fmt}")
        self._current: tuple[Any, ...] | None = None

    def plan(self, fits: list[tuple[str, str, str, float]]) -> None:
        """The fits to come: (model, kind, condition, expected cost) each."""
        for model, kind, condition, cost in fits:
            self.costs[(model, condition)] = (kind, cost)
        self.total.total = len(self.costs)
        self.total.refresh()

    def epoch(self, model: str, condition: str) -> None:
        self._inner(model, condition, "epochs", self.epochs.get(model, 0))
        self.inner.update(1)

    def phase(self, model: str, condition: str, what: str, done: int, total: int) -> None:
        self._inner(model, condition, what, total)
        self.inner.update(done - self.inner.n)

    def _inner(self, model: str, condition: str, what: str, total: int) -> None:
        if self._current != (model, condition, what):
            self._current = (model, condition, what)
            self.inner.reset(total=total)
            self.inner.set_description_str(f"  {model} {condition}: {what}")

    def done(self, model: str, condition: str, seconds: float, resumed: bool = False) -> None:
        """One fit finished (`resumed`: read back from an earlier run)."""
        key = (model, condition)
        self.finished.add(key)
        kind, cost = self.costs.get(key, ("", 0.0))
        if not resumed and cost > 0:
            for name in (f"model:{model}", f"kind:{kind}", "run"):
                self.measured[name][0] += seconds
                self.measured[name][1] += cost
        self._current = None
        left = self.time_left()
        if self.terminal:
            self.total.set_postfix_str(f", {left}", refresh=False)
            self.total.update(1)
        elif not self.quiet:
            how = "read back from an earlier run" if resumed else f"{seconds:.1f} s"
            print(f"{self.label}: {len(self.finished)}/{len(self.costs)} fits, {model} on {condition} done "
                  f"({how}); {left}", file=self.file, flush=True)

    def seconds_left(self) -> float | None:
        """The expected seconds of the fits not yet finished, each at the calibrated rate of its model, else of its
        kind, else of the run; None before any fit was measured."""
        if self.measured["run"][1] <= 0:
            return None
        left = 0.0
        for key, (kind, cost) in self.costs.items():
            if key in self.finished:
                continue
            rate = next(seconds / spent for seconds, spent in (self.measured[f"model:{key[0]}"],
                                                               self.measured[f"kind:{kind}"], self.measured["run"])
                        if spent > 0)
            left += cost * rate
        return left

    def time_left(self) -> str:
        seconds = self.seconds_left()
        if seconds is None:
            return "time left not yet known"
        return f"about {_duration(seconds)} left" if seconds >= 1 else "done"

    def close(self) -> None:
        self.inner.close()
        self.total.close()


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def _is_terminal(file: Any) -> bool:
    try:
        return bool(file.isatty())
    except (AttributeError, ValueError):
        return False
