"""The cost of one ProbeGen training step by number of probes, as `stz bench` trains it: 3 seeds as one batched
model (`torch.func.vmap` over their stacked parameters), each on its own batch of 16 MNIST checkpoints, forward
and backward through every checkpoint's network on the probes. Random weights of the MNIST architecture stand in
for a zoo's (the cost does not depend on their values). Each way is timed `--repeats` times, interleaved, the
fastest counts; ratios are against the default number of probes, in the same command.

    python benchmarks/bench_probegen.py [--probes 32 16 8] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import common  # noqa: F401  (puts the project on sys.path)
import torch
from torch.func import functional_call, stack_module_state, vmap

from nfn_baselines.models.predictors import get_predictor
from nfn_baselines.models.probegen import ProbeGen
from small_transformer_zoo import mnist_spec
from small_transformer_zoo.weights.weight_space import TransformerWeights

SEEDS, BATCH = 3, 16


def training_step(probes: int, autocast: bool = False) -> Callable[[], None]:
    """One step of `SEEDS` ProbeGen models with `probes` probes each: forward and backward on a batch."""
    spec = mnist_spec()
    torch.manual_seed(0)
    params, buffers = stack_module_state([ProbeGen(spec, probes=probes) for _ in range(SEEDS)])
    base = ProbeGen(spec, probes=probes).to("meta")
    rows = torch.randn(SEEDS, BATCH, spec.n_params) * 0.2

    def call(p: dict, b: dict, x: torch.Tensor) -> torch.Tensor:
        return functional_call(base, (p, b), (TransformerWeights.from_params(x, spec),))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = vmap(call)(params, buffers, rows)
        out.sum().backward()
    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = int(get_predictor("probegen").settings["probes"])
    parser.add_argument("--probes", type=int, nargs="+", default=sorted({32, 16, 8, default}, reverse=True))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ways = {f"{k} probes": training_step(k) for k in args.probes}
    ways[f"{default} probes, bf16 autocast"] = training_step(default, autocast=True)
    for step in ways.values():
        step()
    best = dict.fromkeys(ways, float("inf"))
    for _ in range(args.repeats):
        for name, step in ways.items():
            start = time.perf_counter()
            step()
            best[name] = min(best[name], time.perf_counter() - start)
    reference = best[f"{default} probes"]
    print(f"ProbeGen training steps: {SEEDS} seeds vmapped, batches of {BATCH} MNIST checkpoints, "
          f"{args.threads} thread(s); torch {torch.__version__}; the default is {default} probes")
    for name, seconds in best.items():
        print(f"  {name:28s} {seconds * 1000:8.1f} ms per step  {reference / seconds:5.2f}x the default")


if __name__ == "__main__":
    main()
