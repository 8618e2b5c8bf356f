"""Training several copies of one predictor together (one batched model, `torch.func`) against one after another.

    python benchmarks/bench_predictor_training.py --models 12 --train 1000 --epochs 3

`stz bench --tune --seeds 3` trains 12 copies of every neural model (4 trials x 3 seeds) on the same data; the
STATNNs train as one batched model on a CPU (`BATCHED_ON_CPU`). This trains `--models` copies (seeds 0..,
the `--tune` trials' learning rates and weight decays in turn) of each predictor both ways on a synthetic zoo of
real size, checks that both ways give the same predictions, and prints the ratio of their times.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from common import PROJECT  # noqa: F401  (sets up the import path)

from nfn_baselines.bench.benchmark import BATCHED_ON_CPU
from nfn_baselines.bench.request import tuning_trials
from nfn_baselines.models.predictors import get_predictor
from nfn_baselines.models.train import TrainConfig, predict, train_predictor, train_predictors
from small_transformer_zoo.format.architecture import mnist_spec
from small_transformer_zoo.testing.labelled_weights import shifted_bias_weights

SPEC = mnist_spec()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=12)
    parser.add_argument("--train", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--predictors", nargs="+", default=["mlp", *BATCHED_ON_CPU, "transformer_nfn"])
    args = parser.parse_args()
    train, validation = shifted_bias_weights(SPEC, args.train, 0), shifted_bias_weights(SPEC, max(50, args.train // 5), 1)
    trials = tuning_trials(args.epochs)
    configs = [TrainConfig(epochs=args.epochs, warmup_epochs=1, seed=k, lr=trials[k % len(trials)]["lr"],
                           weight_decay=trials[k % len(trials)]["weight_decay"]) for k in range(args.models)]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.models} copies of each predictor, "
          f"{args.train} training and {len(validation[1])} validation checkpoints, {args.epochs} epochs, batch "
          f"{configs[0].batch_size}")
    print(f"  {'predictor':<18} {'one by one':>11} {'together':>10} {'speed-up':>9} {'max prediction diff':>20}")
    for name in args.predictors:
        predictor = get_predictor(name)

        def fresh() -> list[torch.nn.Module]:
            nets = []
            for config in configs:
                torch.manual_seed(config.seed)
                nets.append(predictor.build(SPEC, dict(predictor.settings), 1))
            return nets

        start = time.perf_counter()
        alone = [train_predictor(net, SPEC, train, validation, config) for net, config in zip(fresh(), configs)]
        one_by_one = time.perf_counter() - start
        start = time.perf_counter()
        together = train_predictors(fresh(), SPEC, train, validation, configs)
        batched = time.perf_counter() - start
        diff = max(float(np.abs(predict(a.model, validation[0], SPEC) - predict(b.model, validation[0], SPEC)).max())
                   for a, b in zip(alone, together))
        print(f"  {name:<18} {one_by_one:>10.1f}s {batched:>9.1f}s {one_by_one / batched:>8.2f}x {diff:>20.1e}")


if __name__ == "__main__":
    main()
