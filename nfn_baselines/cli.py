"""The `stz` subcommands of nfn_baselines (registered through the `stz.commands` entry point)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tqdm import tqdm

from .metrics import DEFAULT_THRESHOLDS
from .quickstart import register as register_quickstart


def _bench(args: argparse.Namespace) -> int:
    from .benchmark import (load_bench_data, model_specs, plot_predictions, render_markdown, run_benchmark,
                            summarize, write_results)

    models = model_specs(args.models, args.ablation)
    seeds = list(range(args.seeds))
    data = load_bench_data(args.zoo, args.config)
    started = time.perf_counter()
    bar = tqdm(total=len(models) * len(seeds), desc="bench", unit="fit", file=sys.stderr)

    def done(name: str, seed: int, row: dict) -> None:
        bar.update(1)
        bar.set_postfix_str(f"{name} seed {seed}: tau {row['tau']:.3f}")

    result = run_benchmark(data, models, seeds, args.epochs, tuple(args.thresholds), on_done=done)
    bar.close()
    summary = summarize(result)
    markdown = render_markdown(summary, args.thresholds, len(seeds), args.config)
    elapsed = time.perf_counter() - started
    paths = write_results(Path(args.out), args.config, summary, result, markdown,
                          {"zoo": str(args.zoo), "config": args.config, "seeds": seeds, "epochs": args.epochs,
                           "thresholds": list(args.thresholds), "seconds": elapsed})
    plot = plot_predictions(result, Path(args.out) / f"{args.config}-predicted-vs-true.png", args.config)
    print(markdown)
    print(f"{elapsed:.0f} s; wrote {paths['markdown']}, {paths['json']} and {plot}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    register_quickstart(sub)
    bench = sub.add_parser("bench", help="train Transformer-NFN and the baselines on a zoo, print Kendall's tau")
    bench.add_argument("--zoo", required=True, help="zoo root")
    bench.add_argument("--config", required=True)
    bench.add_argument("--seeds", type=int, default=5)
    bench.add_argument("--epochs", type=int, default=30, help="epochs for the neural models")
    bench.add_argument("--models", nargs="+", default=["transformer_nfn", "mlp", "statnn", "xgboost", "lightgbm",
                                                       "random_forest"])
    bench.add_argument("--ablation", choices=("components", "width-depth"),
                       help="add the NFN component ablation (paper Table 3) or width/depth ablation (Table 5)")
    bench.add_argument("--thresholds", type=float, nargs="+", default=list(DEFAULT_THRESHOLDS))
    bench.add_argument("--out", default="stz-out/bench", help="folder for the JSON, Markdown and plots")
    bench.set_defaults(func=_bench)
