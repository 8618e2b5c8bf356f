"""The `stz` subcommands of nfn_baselines (registered through the `stz.commands` entry point)."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from typing import TYPE_CHECKING

from small_transformer_zoo.cli import add_zoo_argument, bounded
from small_transformer_zoo.devices import usable_cores
from small_transformer_zoo.format.splits import SPLIT_UNITS
from small_transformer_zoo.weights.groups import RANDOMIZE_GROUPS

from .models.metrics import DEFAULT_THRESHOLDS

_DEFAULT_THRESHOLDS_TEXT = " ".join(f"{t:g}" for t in DEFAULT_THRESHOLDS)
from .models.predictors import PREDICTORS, default_predictors
from .bench.protocols import PROTOCOLS
from .models.targets import TARGETS

if TYPE_CHECKING:
    from small_transformer_zoo import Zoo


def _bench(args: argparse.Namespace) -> int:

    from small_transformer_zoo.format.selection import parse_where
    from small_transformer_zoo.plots import plot_accuracy_histogram

    from .bench.progress import BenchProgress
    from .bench.request import fixed_recipe_notes
    from .bench.runs import BenchRequest, bench_store, run_bench
    from .leaderboard.scoring import add_result, load_leaderboard, results_path, score_submission

    models = [("transformer_nfn_paper" if m == "transformer_nfn" and args.recipe == "paper" else m)
              for m in args.models]
    request = BenchRequest(
        models=models, ablation=args.ablation, seeds=args.seeds, epochs=args.epochs, preprocess=args.preprocess,
        protocol=args.protocol, epoch=args.epoch, where=parse_where(args.where or []), target=args.target,
        tune=args.tune, resplit=args.resplit, train_runs=args.train_runs, thresholds=tuple(args.thresholds),
        device=args.device, jobs=args.jobs, resamples=args.resamples,
        bootstrap_seed=args.bootstrap_seed, split_by=args.split_by, randomize=args.randomize,
        floors=not args.no_floors, settings={k: v for k, v in (("head_dropout", args.head_dropout), ("weight_decay", args.weight_decay),
                                    ("patience", args.patience)) if v is not None})
    if args.leaderboard:
        results_path(args.leaderboard)  # a folder or a damaged file is said now, not after the training
        load_leaderboard(args.leaderboard)
    zoo = _bench_zoo(args)
    print(f"zoo: {zoo.dir}", file=sys.stderr)
    for note in fixed_recipe_notes(models, request.epochs, request.tune):
        print(note, file=sys.stderr)
    out = Path(args.out) if args.out else (Path(args.root) / "bench" if Path(args.root).is_dir() else
                                           Path("stz-out") / "bench")
    fits = request.fit_count(zoo.spec)
    store = bench_store(zoo, request, out)
    if len(store) and not args.fresh:
        if store.finished:
            print(f"reusing: {len(store)} of {fits} fits of an earlier run of this command ({store.kept}; --fresh "
                  f"trains them again)", file=sys.stderr)
        else:
            print(f"resuming: {len(store)} of {fits} fits already done by a stopped run of this command "
                  f"({store.folder}; --fresh trains them again)", file=sys.stderr)
    progress = BenchProgress(request, spec=zoo.spec)
    outcome = run_bench(zoo, request, out, fresh=args.fresh, progress=progress)
    progress.close()
    histogram = plot_accuracy_histogram(zoo, out / f"{zoo.config}-accuracy-histogram.png")
    rankers = [n for n in outcome.result.models if f"submission:{n}" not in outcome.paths]
    if rankers:
        print(f"no submission{f' entered in {args.leaderboard}' if args.leaderboard else ''} for "
              f"{', '.join(rankers)}: they rank checkpoints; their values are not in the unit of {request.target}",
              file=sys.stderr)
    if args.leaderboard:  # our own models enter through the same scorer as everyone's
        for name in (n for n in outcome.result.models if n not in rankers):
            submission = outcome.paths[f"submission:{name}"]
            metrics = score_submission(submission, zoo, zoo.config, "test", request.thresholds, target=request.target,
                                       protocol=request.protocol, epoch=request.epoch, where=request.where)
            add_result(args.leaderboard, name, zoo.config, "test", metrics, f"stz bench (seed 0) {submission}")
    print(outcome.markdown)
    written = ", ".join(str(p) for k, p in outcome.paths.items() if not k.startswith("submission:"))
    resumed = f" ({outcome.resumed} fits resumed; training took {outcome.training_seconds:.0f} s in all)" \
        if outcome.resumed else ""
    print(f"{outcome.seconds:.0f} s{resumed}; wrote {written}, {histogram} and a submission per predicting model under "
          f"{out / 'submissions'}")
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
    from small_transformer_zoo.format.selection import parse_where

    from .leaderboard.scoring import add_result, score_submission, selection_text
    from .models.metrics import MIN_RUNS, too_few_runs

    zoo = open_zoo(args.root, args.config, args.revision)
    args.config = zoo.config
    metrics = score_submission(args.submission, zoo, zoo.config, args.split, tuple(args.thresholds), args.target,
                               protocol=args.protocol, epoch=args.epoch, where=parse_where(args.where or []))
    boot = metrics["bootstrap"]
    selected = f" ({selection_text(metrics['selection'])})" if metrics.get("selection") else ""
    print(f"{args.submission}: {metrics['n']} checkpoints of {metrics['runs']} runs of {zoo.dir}/{args.split}"
          f"{selected}, target {args.target}; 95% intervals from {boot['resamples']} bootstrap resamples of the runs "
          f"(seed {boot['seed']})")
    for key, (low, high) in metrics["intervals"].items():
        value, runs = metrics[key], metrics["column_runs"][key]
        if too_few_runs(runs):
            print(f"  {key:<10} too few runs ({runs}; a figure needs {MIN_RUNS})")
            continue
        shown = "undefined" if value is None or not math.isfinite(value) else f"{value:.4f}"
        bounds = "" if low is None or not math.isfinite(low) else f"  [{low:.4f}, {high:.4f}]"
        print(f"  {key:<10} {shown}{bounds}  ({runs} runs)")
    if args.leaderboard:
        add_result(args.leaderboard, args.name or Path(args.submission).stem, args.config, args.split, metrics,
                   str(args.submission))
        print(f"added to {args.leaderboard}")
    return 0


def _leaderboard(args: argparse.Namespace) -> int:
    from .leaderboard.scoring import SubmissionError, load_leaderboard, render_leaderboard

    if args.results == "init":
        from .leaderboard.hub import create_leaderboard

        if not args.repo:
            raise ValueError("name the repo: stz leaderboard init OWNER/NAME")
        url = create_leaderboard(args.repo, private=args.private)
        print(f"created leaderboard {args.repo} ({url}): an empty results.json; participants submit with "
              f"`stz submit FILE --leaderboard {args.repo} --zoo ZOO --name NAME`")
        return 0
    if args.repo:
        raise ValueError(f"unexpected argument {args.repo!r} (only `stz leaderboard init REPO` takes a repo)")

    if args.hub:
        from .leaderboard.hub import hub_results

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
    from small_transformer_zoo.format.selection import parse_where

    from .leaderboard.hub import main_metric_text, submit

    zoo = open_zoo(args.root, args.config, args.revision)
    done = submit(args.submission, args.leaderboard, zoo, zoo.config, args.split, args.name, tuple(args.thresholds),
                  target=args.target, protocol=args.protocol, epoch=args.epoch, where=parse_where(args.where or []))
    local = ("labels withheld in this zoo: the maintainers score it" if done.metrics is None
             else f"{main_metric_text(done.metrics)} against the labels of {zoo.dir}")
    print(f"opened pull request #{done.pr_num} on {args.leaderboard}: {done.pr_url} ({local})")
    return 0


def _review(args: argparse.Namespace) -> int:
    from .leaderboard.hub import main_metric_text, open_pull_requests, review

    numbers = args.pr or open_pull_requests(args.leaderboard)
    if not numbers:
        print(f"{args.leaderboard}: no open pull requests")
    for num in numbers:
        done = review(args.leaderboard, num, args.root, merge=args.merge, thresholds=tuple(args.thresholds),
                      splits=tuple(args.splits))
        claimed = done.claim["metrics"]
        seen = "no local scores (labels withheld)" if claimed is None else f"claimed {main_metric_text(claimed)}"
        print(f"#{num} {done.claim['name']} ({done.claim['config']}/{done.claim['split']}): "
              f"{main_metric_text(done.metrics)} against the held-out labels, {seen}"
              f"{'; added to results.json and merged' if done.merged else ''}")
    return 0


def _add_selection_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """--protocol, --epoch and --where: one meaning for `stz bench`, `stz score` and `stz submit`."""
    parser.add_argument("--protocol", default="all-checkpoints", choices=list(PROTOCOLS),
                        help=f"{what}: all-checkpoints: every selected checkpoint, tau above a threshold on the test "
                             "checkpoints above it; paper: one checkpoint per run (--epoch) and, in `stz bench`, per "
                             "threshold the zoo filtered first, then trained and tested on what passed (default: "
                             "all-checkpoints)")
    parser.add_argument("--epoch", type=bounded(int, 1), help="paper protocol: the epoch whose checkpoint each run "
                                                              "gives (default: 3/4 of a built zoo's epochs; 75 for an "
                                                              "imported release)")
    parser.add_argument("--where", nargs="+", metavar="COLUMN=VALUE",
                        help="select checkpoints by metadata, as Zoo.select(where=...): optimizer=adam, "
                             "epoch=1,6,12 (any of), learning_rate=1e-4..1e-3 (range), train_loss=null")


def _add_split_arguments(bench: argparse.ArgumentParser) -> None:
    """How `stz bench` splits and moves the zoo's runs: other splits, family splits, a share of the training runs,
    random symmetries."""
    bench.add_argument("--resplit", type=bounded(int, 0), default=0, metavar="K",
                       help="repeat on K other run splits of the zoo (salts resplit-1..K) and report the spread "
                            "across splits next to the spread across seeds (default: 0)")
    bench.add_argument("--split-by", choices=list(SPLIT_UNITS),
                       help="split the runs again with this unit: run (each run hashed alone) or family (runs that "
                            "differ only in L2 and init std share a split, so near-clones never straddle train and "
                            "test); default: the zoo's own split")
    bench.add_argument("--randomize", choices=list(RANDOMIZE_GROUPS),
                       help="move every checkpoint by a random element of this symmetry group (seeded by its id) "
                            "before any model sees it: paper-group (heads, GL(D_k), MLP units), interfaces (the "
                            "features between blocks and before the classifier) or all; a model invariant under "
                            "the group scores the same, one that reads index positions does not")
    bench.add_argument("--train-runs", type=bounded(float, 0, 1, low_open=True), default=1.0, metavar="SHARE",
                       help="train on this share of the training runs (a seeded draw; a learning curve point) "
                            "(default: 1)")


def _add_bench_parser(sub: argparse._SubParsersAction) -> None:
    """`stz bench` and its options."""
    bench = sub.add_parser("bench", help="train Transformer-NFN, the baselines and the floors on a zoo, print the "
                                         "table with 95%% intervals")
    bench.add_argument("root", nargs="?", metavar="ZOO",
                       help="zoo root: a local folder or a Hub dataset repo id (owner/name)")
    bench.add_argument("--zoo", dest="zoo_option", metavar="ZOO", help=argparse.SUPPRESS)
    bench.add_argument("--config", help="zoo config (default: the root's only one)")
    bench.add_argument("--revision", help="Hub branch or commit of a repo id (default: main)")
    bench.add_argument("--target", default="test_accuracy", choices=list(TARGETS),
                       help="what the models predict: " + "; ".join(f"{t.name} ({t.description})"
                                                                   for t in TARGETS.values())
                            + " (default: test_accuracy)")
    _add_selection_arguments(bench, "the checkpoints trained and scored on")
    bench.add_argument("--seeds", type=bounded(int, 1), default=5, help="seeds per model (default: 5)")
    bench.add_argument("--epochs", type=bounded(int, 1), default=30,
                       help="epochs for the neural models (default: 30); a model with a fixed recipe, such as "
                            "--recipe paper's, trains its own")
    bench.add_argument("--tune", action="store_true",
                       help="search learning rate, weight decay and epochs of every neural model on validation "
                            "(4 trials, the same for every model); the untuned table is printed too")
    _add_split_arguments(bench)
    bench.add_argument("--preprocess", choices=("none", "standardize", "canonical", "both", "align"), default="none",
                       help="what every model sees: raw weights, standardised ones (statistics of the training "
                            "split, stored in the results JSON), canonical forms, or both; align: every checkpoint "
                            "permuted by weight matching to one training checkpoint, the one of median L2 norm "
                            "(default: none)")
    bench.add_argument("--models", nargs="+", choices=list(PREDICTORS), default=default_predictors(),
                       metavar="MODEL", help=f"registered predictors to train, from {list(PREDICTORS)} (default: "
                                         f"{' '.join(default_predictors())}); the floors join any list")
    bench.add_argument("--no-floors", action="store_true",
                       help="leave the reference rows (the floors: l2_norm, epoch, hyperparameters, nearest_run) out "
                            "of a table of named --models")
    bench.add_argument("--recipe", choices=("package", "paper"), default="package",
                       help="Transformer-NFN's recipe: package (means, the package's heads, --epochs) or paper (the "
                            "authors' model and training, term by term: the transformer_nfn_paper predictor in place "
                            "of transformer_nfn) (default: package)")
    bench.add_argument("--head-dropout", type=bounded(float, 0, 1, high_open=True),
                       help="dropout before every neural model's head (default: 0)")
    bench.add_argument("--weight-decay", type=bounded(float, 0), help="weight decay of the neural models (default: "
                                                                      "0; --tune searches it)")
    bench.add_argument("--patience", type=bounded(int, 1),
                       help="stop a neural model after this many epochs without a better validation score")
    bench.add_argument("--jobs", type=bounded(int, 1), default=usable_cores(),
                       help="threads of the tree models (default: the cores this process may use)")
    bench.add_argument("--ablation", choices=("components", "width-depth"),
                       help="add the NFN component ablation (paper Table 3) or width/depth ablation (Table 5)")
    bench.add_argument("--thresholds", type=bounded(float, 0, 1, low_open=True, high_open=True), nargs="*",
                       default=list(DEFAULT_THRESHOLDS),
                       help=f"accuracy thresholds; the flag alone: none, only the unfiltered zoo is trained and scored "
                            f"(default: {_DEFAULT_THRESHOLDS_TEXT})")
    bench.add_argument("--resamples", type=bounded(int, 100), default=1000,
                       help="bootstrap resamples of the test runs for the intervals (default: 1000)")
    bench.add_argument("--bootstrap-seed", type=bounded(int, 0), default=0, help="seed of the resamples (default: 0)")
    bench.add_argument("--out", help="folder for the JSON, Markdown, plots and submissions (default: ZOO/bench for a "
                                     "local root, stz-out/bench for a Hub repo)")
    bench.add_argument("--leaderboard", help="score each model's first-seed predictions into this results file")
    bench.add_argument("--device", default="auto", help="where the neural models train: auto (CUDA when torch sees a "
                                                       "GPU), cpu, cuda or cuda:N; trees use the CPU (default: auto)")
    bench.add_argument("--fresh", action="store_true",
                       help="train every fit again, ignoring those a stopped run of the same command left in "
                            "OUT/.resume (default: resume them)")
    bench.set_defaults(func=_bench)


def register(sub: argparse._SubParsersAction) -> None:
    score = sub.add_parser("score", help="validate and score a leaderboard submission (CSV or Parquet)")
    score.add_argument("submission", help="file with columns checkpoint_id and predicted_<target> (predicted_accuracy "
                                          "for the default target)")
    score.add_argument("--target", default="test_accuracy", choices=list(TARGETS),
                       help="what the submission predicts (default: test_accuracy)")
    add_zoo_argument(score, positional=False)
    score.add_argument("--split", default="test", help="split the predictions are for (default: test)")
    score.add_argument("--thresholds", type=bounded(float, 0, 1, low_open=True, high_open=True), nargs="+", default=list(DEFAULT_THRESHOLDS),
                       help=f"accuracy thresholds (default: {_DEFAULT_THRESHOLDS_TEXT})")
    _add_selection_arguments(score, "the checkpoints the predictions are for, as `stz bench` selected them")
    score.add_argument("--leaderboard", help="results file (JSON) to add the scores to")
    score.add_argument("--name", help="name on the leaderboard (default: the file name)")
    score.set_defaults(func=_score)
    board = sub.add_parser("leaderboard", help="render a leaderboard results file as ranked Markdown tables; "
                                               "`stz leaderboard init REPO` creates a Hub leaderboard repo")
    board.add_argument("results", nargs="?", default="leaderboard.json",
                       help="local results file (default: leaderboard.json), or `init`")
    board.add_argument("repo", nargs="?", metavar="REPO", help="with init: the Hub dataset repo to create")
    board.add_argument("--private", action="store_true", help="with init: create the repo private")
    board.add_argument("--hub", metavar="REPO", help="read the results of this Hub leaderboard repo instead")
    board.add_argument("--revision", help="with --hub: branch or commit (default: main)")
    board.add_argument("--markdown", help="also write the tables to this file")
    board.set_defaults(func=_leaderboard)
    submit = sub.add_parser("submit", help="check and score a submission locally, then open a pull request on a "
                                           "Hub leaderboard repo")
    submit.add_argument("submission", help="file with columns checkpoint_id and predicted_<target> (CSV or Parquet)")
    submit.add_argument("--target", default="test_accuracy", choices=list(TARGETS),
                        help="what the submission predicts (default: test_accuracy)")
    submit.add_argument("--leaderboard", required=True, metavar="REPO", help="the leaderboard's Hub dataset repo")
    add_zoo_argument(submit, positional=False)
    submit.add_argument("--split", default="test", help="split the predictions are for (default: test)")
    submit.add_argument("--name", required=True, help="name on the leaderboard (letters, digits, ' ._-')")
    submit.add_argument("--thresholds", type=bounded(float, 0, 1, low_open=True, high_open=True), nargs="+", default=list(DEFAULT_THRESHOLDS),
                        help=f"accuracy thresholds of the local scores (default: {_DEFAULT_THRESHOLDS_TEXT})")
    _add_selection_arguments(submit, "the checkpoints the predictions are for, as `stz bench` selected them")
    submit.set_defaults(func=_submit)
    rev = sub.add_parser("review", help="maintainers: re-score a leaderboard's pull requests against the full zoo "
                                        "and merge them")
    rev.add_argument("leaderboard", metavar="REPO", help="the leaderboard's Hub dataset repo")
    rev.add_argument("--zoo", dest="root", required=True, metavar="ZOO",
                     help="the full zoo root, with the held-out labels: a local folder or a Hub dataset repo id")
    rev.add_argument("--pr", type=bounded(int, 1), nargs="+", help="pull request numbers (default: every open one)")
    rev.add_argument("--merge", action="store_true", help="add the scores to results.json and merge (default: "
                                                          "print the scores only)")
    rev.add_argument("--splits", nargs="+", default=["test"], metavar="SPLIT",
                     help="the splits this leaderboard scores, those its public zoo withholds (default: test); a "
                          "submission for another split is refused")
    rev.add_argument("--thresholds", type=bounded(float, 0, 1, low_open=True, high_open=True), nargs="+", default=list(DEFAULT_THRESHOLDS),
                     help=f"accuracy thresholds (default: {_DEFAULT_THRESHOLDS_TEXT})")
    rev.set_defaults(func=_review)
    _add_bench_parser(sub)
