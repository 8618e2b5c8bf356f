"""The `stz` subcommands of nfn_baselines (registered through the `stz.commands` entry point)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from typing import TYPE_CHECKING

from small_transformer_zoo.cli import add_zoo_argument
from small_transformer_zoo.devices import usable_cores

from .metrics import DEFAULT_THRESHOLDS
from .predictors import PREDICTORS, default_predictors

if TYPE_CHECKING:
    from small_transformer_zoo import Zoo


def _bench(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from small_transformer_zoo.devices import resolve_device
    from small_transformer_zoo.plots import plot_accuracy_histogram

    from .benchmark import (load_bench_data, model_specs, plot_predictions, render_markdown, run_benchmark,
                            summarize, write_results)
    from .leaderboard import add_result, score_submission, write_submission

    models = model_specs(args.models, args.ablation)
    seeds = list(range(args.seeds))
    zoo = _bench_zoo(args)
    args.config = zoo.config
    out = Path(args.out) if args.out else (Path(args.root) / "bench" if Path(args.root).is_dir() else
                                           Path("stz-out") / "bench")
    data = load_bench_data(zoo, preprocess=args.preprocess)
    started = time.perf_counter()
    bar = tqdm(total=len(models) * len(seeds), desc="bench", unit="fit", file=sys.stderr)

    def done(name: str, seed: int, row: dict) -> None:
        bar.update(1)
        bar.set_postfix_str(f"{name} seed {seed}: tau {row['tau']:.3f}")

    result = run_benchmark(data, models, seeds, args.epochs, tuple(args.thresholds), on_done=done,
                           device=str(resolve_device(args.device)), n_jobs=args.jobs)
    bar.close()
    summary = summarize(result)
    markdown = render_markdown(summary, args.thresholds, len(seeds), args.config)
    elapsed = time.perf_counter() - started
    paths = write_results(out, args.config, summary, result, markdown,
                          {"zoo": str(args.root), "config": args.config, "seeds": seeds, "epochs": args.epochs,
                           "thresholds": list(args.thresholds), "preprocess": args.preprocess, "seconds": elapsed,
                           "weight_stats": data.stats.to_dict() if data.stats else None})
    plot = plot_predictions(result, out / f"{args.config}-predicted-vs-true.png", args.config)
    histogram = plot_accuracy_histogram(zoo, out / f"{args.config}-accuracy-histogram.png")
    for name, predicted in result.predictions.items():
        submission = write_submission(out / "submissions" / f"{args.config}-{name}.csv", data.test_ids,
                                      predicted)
        if args.leaderboard:  # our own models enter through the same scorer as everyone's
            metrics = score_submission(submission, zoo, args.config, "test", tuple(args.thresholds))
            add_result(args.leaderboard, name, args.config, "test", metrics, f"stz bench (seed 0) {submission}")
    print(markdown)
    print(f"{elapsed:.0f} s; wrote {paths['markdown']}, {paths['json']}, {plot} and {histogram}")
    return 0


def _bench_zoo(args: argparse.Namespace) -> Zoo:
    """The zoo of `stz bench ZOO` (or the older spelling `--zoo ZOO`)."""
    from small_transformer_zoo import open_zoo

    if (args.root is None) == (args.zoo_option is None):
        raise ValueError("name the zoo once: stz bench ZOO [--config NAME]")
    args.root = args.root or args.zoo_option
    return open_zoo(args.root, args.config, args.revision)


def _score(args: argparse.Namespace) -> int:
    from small_transformer_zoo import open_zoo

    from .leaderboard import add_result, score_submission

    zoo = open_zoo(args.root, args.config, args.revision)
    args.config = zoo.config
    metrics = score_submission(args.submission, zoo, zoo.config, args.split, tuple(args.thresholds))
    print(f"{args.submission}: {metrics['n']} checkpoints of {args.config}/{args.split}")
    for key, value in metrics.items():
        if not key.startswith("n"):
            print(f"  {key:<10} {value:.4f}")
    if args.leaderboard:
        add_result(args.leaderboard, args.name or Path(args.submission).stem, args.config, args.split, metrics,
                   str(args.submission))
        print(f"added to {args.leaderboard}")
    return 0


def _leaderboard(args: argparse.Namespace) -> int:
    from .leaderboard import SubmissionError, load_leaderboard, render_leaderboard

    if args.hub:
        from .hub_leaderboard import hub_results

        entries, source = hub_results(args.hub, args.revision), f"dataset {args.hub}"
    else:
        if not Path(args.results).is_file():
            raise SubmissionError(f"{args.results}: no such results file (`stz score ... --leaderboard FILE` makes "
                                  f"one)")
        entries, source = load_leaderboard(args.results), args.results
    text = render_leaderboard(entries)
    if args.markdown:
        Path(args.markdown).write_text(text)
    print(text or f"{source}: no results yet")
    return 0


def _submit(args: argparse.Namespace) -> int:
    from small_transformer_zoo import open_zoo

    from .hub_leaderboard import submit

    zoo = open_zoo(args.root, args.config, args.revision)
    done = submit(args.submission, args.leaderboard, zoo, zoo.config, args.split, args.name, tuple(args.thresholds))
    local = ("labels withheld in this zoo: the maintainers score it" if done.metrics is None
             else f"tau {done.metrics['tau']:.4f} against the labels of {args.root}")
    print(f"opened pull request #{done.pr_num} on {args.leaderboard}: {done.pr_url} ({local})")
    return 0


def _review(args: argparse.Namespace) -> int:
    from .hub_leaderboard import open_pull_requests, review

    numbers = args.pr or open_pull_requests(args.leaderboard)
    if not numbers:
        print(f"{args.leaderboard}: no open pull requests")
    for num in numbers:
        done = review(args.leaderboard, num, args.root, merge=args.merge, thresholds=tuple(args.thresholds))
        claimed = done.claim["metrics"]
        seen = "no local scores (labels withheld)" if claimed is None else f"claimed tau {claimed['tau']:.4f}"
        print(f"#{num} {done.claim['name']} ({done.claim['config']}/{done.claim['split']}): tau "
              f"{done.metrics['tau']:.4f} against the held-out labels, {seen}"
              f"{'; added to results.json and merged' if done.merged else ''}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    score = sub.add_parser("score", help="validate and score a leaderboard submission (CSV or Parquet)")
    score.add_argument("submission", help="file with columns checkpoint_id, predicted_accuracy")
    add_zoo_argument(score, positional=False)
    score.add_argument("--split", default="test", help="split the predictions are for (default: test)")
    score.add_argument("--thresholds", type=float, nargs="+", default=list(DEFAULT_THRESHOLDS),
                       help="accuracy thresholds (default: 0.2 0.4 0.6 0.8)")
    score.add_argument("--leaderboard", help="results file (JSON) to add the scores to")
    score.add_argument("--name", help="name on the leaderboard (default: the file name)")
    score.set_defaults(func=_score)
    board = sub.add_parser("leaderboard", help="render a leaderboard results file as ranked Markdown tables")
    board.add_argument("results", nargs="?", default="leaderboard.json",
                       help="local results file (default: leaderboard.json)")
    board.add_argument("--hub", metavar="REPO", help="read the results of this Hub leaderboard repo instead")
    board.add_argument("--revision", help="with --hub: branch or commit (default: main)")
    board.add_argument("--markdown", help="also write the tables to this file")
    board.set_defaults(func=_leaderboard)
    submit = sub.add_parser("submit", help="check and score a submission locally, then open a pull request on a "
                                           "Hub leaderboard repo")
    submit.add_argument("submission", help="file with columns checkpoint_id, predicted_accuracy (CSV or Parquet)")
    submit.add_argument("--leaderboard", required=True, metavar="REPO", help="the leaderboard's Hub dataset repo")
    add_zoo_argument(submit, positional=False)
    submit.add_argument("--split", default="test", help="split the predictions are for (default: test)")
    submit.add_argument("--name", required=True, help="name on the leaderboard (letters, digits, ' ._-')")
    submit.add_argument("--thresholds", type=float, nargs="+", default=list(DEFAULT_THRESHOLDS),
                        help="accuracy thresholds of the local scores (default: 0.2 0.4 0.6 0.8)")
    submit.set_defaults(func=_submit)
    rev = sub.add_parser("review", help="maintainers: re-score a leaderboard's pull requests against the full zoo "
                                        "and merge them")
    rev.add_argument("leaderboard", metavar="REPO", help="the leaderboard's Hub dataset repo")
    rev.add_argument("--zoo", dest="root", required=True, metavar="ZOO",
                     help="the full zoo root, with the held-out labels: a local folder or a Hub dataset repo id")
    rev.add_argument("--pr", type=int, nargs="+", help="pull request numbers (default: every open one)")
    rev.add_argument("--merge", action="store_true", help="add the scores to results.json and merge (default: "
                                                          "print the scores only)")
    rev.add_argument("--thresholds", type=float, nargs="+", default=list(DEFAULT_THRESHOLDS),
                     help="accuracy thresholds (default: 0.2 0.4 0.6 0.8)")
    rev.set_defaults(func=_review)
    bench = sub.add_parser("bench", help="train Transformer-NFN and the baselines on a zoo, print Kendall's tau")
    bench.add_argument("root", nargs="?", metavar="ZOO",
                       help="zoo root: a local folder or a Hub dataset repo id (owner/name)")
    bench.add_argument("--zoo", dest="zoo_option", metavar="ZOO", help=argparse.SUPPRESS)
    bench.add_argument("--config", help="zoo config (default: the root's only one)")
    bench.add_argument("--revision", help="Hub branch or commit of a repo id (default: main)")
    bench.add_argument("--seeds", type=int, default=5, help="seeds per model (default: 5)")
    bench.add_argument("--epochs", type=int, default=30, help="epochs for the neural models (default: 30)")
    bench.add_argument("--preprocess", choices=("none", "standardize", "canonical", "both"), default="none",
                       help="what every model sees: raw weights, standardised ones (statistics of the training "
                            "split, stored in the results JSON), canonical forms, or both (default: none)")
    bench.add_argument("--models", nargs="+", choices=list(PREDICTORS), default=default_predictors(),
                       metavar="MODEL", help=f"registered predictors to train, from {list(PREDICTORS)} (default: "
                                         f"{' '.join(default_predictors())})")
    bench.add_argument("--jobs", type=int, default=usable_cores(), help="threads of the tree models (default: the "
                                                                        "cores this process may use)")
    bench.add_argument("--ablation", choices=("components", "width-depth"),
                       help="add the NFN component ablation (paper Table 3) or width/depth ablation (Table 5)")
    bench.add_argument("--thresholds", type=float, nargs="+", default=list(DEFAULT_THRESHOLDS),
                       help="accuracy thresholds (default: 0.2 0.4 0.6 0.8)")
    bench.add_argument("--out", help="folder for the JSON, Markdown, plots and submissions (default: ZOO/bench for a "
                                     "local root, stz-out/bench for a Hub repo)")
    bench.add_argument("--leaderboard", help="score each model's first-seed predictions into this results file")
    bench.add_argument("--device", default="auto", help="where the neural models train: auto (CUDA when torch sees a "
                                                       "GPU), cpu, cuda or cuda:N; trees use the CPU (default: auto)")
    bench.set_defaults(func=_bench)
