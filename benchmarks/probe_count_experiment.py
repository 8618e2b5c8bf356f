"""ProbeGen at other probe counts: `probegen_16` and `probegen_32` registered beside `probegen` (8 probes), with
the same settings otherwise, then `seeding_experiment.py` on them, which also prints each one paired against
STATNN and against `probegen`. The arguments are `seeding_experiment.py`'s:

    python benchmarks/probe_count_experiment.py zoos --out bench/probes --seeds 3 --per-run mnist-families \
        --models statnn probegen probegen_16 probegen_32 --conditions run

A predictor's name does not enter its seeds, so `probegen_32` here trains as `probegen` did with 32 probes.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import common  # noqa: F401  (puts the project on sys.path)
import seeding_experiment

from nfn_baselines.models.predictors import get_predictor, register_predictor

COUNTS = (16, 32)


def register_probe_counts() -> list[str]:
    """Register `probegen_<K>` for each of COUNTS and add them to the experiment's models and pairs."""
    base = get_predictor("probegen")
    names = []
    for count in COUNTS:
        name = f"probegen_{count}"
        register_predictor(replace(base, name=name, description=f"{base.description}; {count} probes",
                                   settings={**base.settings, "probes": count}))
        seeding_experiment.MODELS.append(name)
        seeding_experiment.PAIRS.extend([(name, "statnn"), ("probegen", name)])
        names.append(name)
    return names


if __name__ == "__main__":
    register_probe_counts()
    seeding_experiment.main()
