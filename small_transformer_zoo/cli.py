"""`stz`: the one console command. Thin over the library; `builders` and `nfn_baselines` add their subcommands
through the `stz.commands` entry point group, so this package never imports them."""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import re
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, NoReturn

from .errors import DataError, ZooNotFoundError, os_error_text
from .format.manifest import package_version


def format_summary(summary: dict) -> str:
    lines = [*([summary["resolved"]] if summary.get("resolved") else []),
             f"config {summary['config']}  ({summary['path']})",
             f"  task: {json.dumps(summary['task'])}",
             f"  parameters per checkpoint: {summary['n_params']:,}; runs: {summary['runs']:,}; "
             f"rows: {summary['checkpoints']:,}; distinct checkpoints: {summary['distinct']:,}",
             f"  seeds: {summary['seed_policy']}; splits {summary['split_rule']}",
             *([f"  training recipe: {summary['recipe']}"] if summary.get("recipe") else []),
             "  (rows: every metadata row, as Zoo.metadata and split_weights give them; distinct checkpoints: a best "
             "checkpoint that copies a stored epoch counted once, as load_dataset and Zoo.select give them, less the diverged ones)",
             f"  {'split':<11}{'rows':>8}{'distinct':>9}{'runs':>7}{'diverged':>9}   "
             f"test accuracy min / median / mean / max"]
    for split, s in summary["splits"].items():
        acc = s["test_accuracy"]
        stats = " / ".join("-" if acc[k] is None else f"{acc[k]:.3f}" for k in ("min", "median", "mean", "max"))
        lines.append(f"  {split:<11}{s['checkpoints']:>8,}{s['distinct']:>9,}{s['runs']:>7,}{s['diverged']:>9,}   "
                     f"{stats}")
    return "\n".join(lines)


def cmd_info(args: argparse.Namespace) -> int:
    from .hub.locate import locate
    from .hub.opening import _open_configs
    from .store.local_index import SHORT_NAME

    resolved = None
    if args.root == SHORT_NAME:
        location = locate(args.root, args.config, args.revision)
        resolved = (f"{SHORT_NAME} {args.config!r} resolves to the zoo registered on this machine at "
                    f"{Path(location.root) / args.config}" if location.kind == "local" else
                    f"{SHORT_NAME} {args.config!r} resolves to the Hub repo {location.repo_id} (no zoo of this config "
                    f"is registered on this machine)")
    for zoo in _open_configs(args.root, args.config, args.revision):
        summary = zoo.summary() | ({"resolved": resolved} if resolved else {})
        if args.clones:
            from .store.census import census_report, format_census

            census = census_report(zoo, args.clone_epoch, args.within, canonical=not args.raw_only)
            summary["clones"] = census
        if args.json:
            print(json.dumps(summary, indent=2))
        else:
            print(format_summary(summary) + (f"\n{format_census(summary['clones'])}" if args.clones else ""))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .hub.opening import _open_configs

    failed = False
    for zoo in _open_configs(args.root, args.config, args.revision):
        bar = tqdm(total=len(zoo.manifest["shards"]), desc=f"verify {zoo.config}", unit="shard", file=sys.stderr,
                   disable=not sys.stderr.isatty())
        problems = zoo.verify(progress=lambda _: bar.update(1))
        bar.close()
        for problem in problems:
            print(f"FAIL {problem}")
        if problems:
            failed = True
        else:
            print(f"OK {zoo.dir}: {len(zoo.manifest['shards'])} shards, {zoo.manifest['counts']['checkpoints']:,} "
                  f"checkpoints, sizes, sha256 and references all match")
    return 1 if failed else 0


def _checkpoint_bar(label: str, off: bool) -> tuple[Any, Callable[[int, int], None]]:
    """A bar over checkpoints on stderr (none when `off` or not a terminal), and the progress callback that moves
    it."""
    from tqdm import tqdm

    bar = tqdm(desc=label, unit="ckpt", file=sys.stderr, disable=off or not sys.stderr.isatty())

    def progress(done: int, total: int) -> None:
        bar.total = total
        bar.update(done - bar.n)
    return bar, progress


def cmd_import_original(args: argparse.Namespace) -> int:
    from .original import import_original

    bar, progress = _checkpoint_bar("import", args.no_progress)
    result = import_original(args.source, args.out, args.config, task=args.task, shard_size=args.shard_size,
                             overwrite=args.overwrite, progress=progress, split_by=args.split_by)
    bar.close()
    counts = result.manifest["counts"]
    kept = f", {result.parts_kept} parts kept from an interrupted import" if result.parts_kept else ""
    print(f"imported {counts['checkpoints']:,} checkpoints of {counts['runs']:,} runs into "
          f"{Path(args.out) / args.config} (train {counts['train']:,}, validation {counts['validation']:,}, "
          f"test {counts['test']:,}){kept}")
    for note in result.notes:
        print(f"note: {note}")
    return 0


def cmd_export_original(args: argparse.Namespace) -> int:
    from .original.exporter import export_original

    bar, progress = _checkpoint_bar("export", args.no_progress)
    result = export_original(args.root, args.config, args.out, as_zip=args.zip, overwrite=args.overwrite,
                             progress=progress)
    bar.close()
    print(f"wrote {result.checkpoints:,} checkpoints of {result.runs:,} runs of {result.zoo} in the authors' release "
          f"layout to {result.path}")
    for note in result.notes:
        print(f"note: {note}")
    return 0


def cmd_register(args: argparse.Namespace) -> int:
    from .store.local_index import SHORT_NAME
    from .store.configs import choose_config, list_configs
    from .store.local_index import register_local_zoo
    from .store.reader import Zoo

    root = Path(args.root)
    configs = list_configs(root)
    chosen = [choose_config(configs, args.config, root)] if args.config or len(configs) <= 1 else configs
    for config in chosen:
        with Zoo.open(root, config):  # a zoo that opens, not any folder
            others = register_local_zoo(config, root, choose=True)
        change = f" (instead of {', '.join(str(r / config) for r in others)})" if others else ""
        print(f"load_dataset({SHORT_NAME!r}, {config!r}) now reads {root.resolve() / config}{change}")
    return 0


def cmd_card(args: argparse.Namespace) -> int:
    from .store.card import render_card, write_root_card
    from .store.configs import list_configs

    if args.print:
        print(render_card(args.root, args.repo, args.clones))
        return 0
    if not list_configs(args.root):
        raise ZooNotFoundError(args.root, "holds no zoo config (no <config>/zoo.json)")
    write_root_card(args.root, args.repo, args.clones)
    print(f"wrote {Path(args.root) / 'README.md'}")
    return 0


def cmd_push(args: argparse.Namespace) -> int:
    from .hub.push import push_zoo

    sha = push_zoo(args.root, args.repo_id, private=args.private, revision=args.revision)
    print(f"pushed {args.root} to dataset {args.repo_id} (commit {sha})")
    return 0


def cmd_public_copy(args: argparse.Namespace) -> int:
    from .store.public_copy import write_public_copy

    configs = write_public_copy(args.root, args.out, args.withhold)
    print(f"wrote {args.out}: configs {configs}, every metric column withheld in splits {args.withhold}; push it "
          f"with `stz push {args.out} REPO` and keep {args.root} to score submissions")
    return 0


class OneLineParser(argparse.ArgumentParser):
    """argparse with the one-line error rule of every command: `stz <command>: error: ...`, exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def bounded(kind: type, low: float | None = None, high: float | None = None, *, low_open: bool = False,
            high_open: bool = False) -> Callable[[str], Any]:
    """An argparse type: a number of `kind` within [low, high] (an end open where asked); anything else is a
    one-line error naming the allowed range."""
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'a whole number' if kind is int else 'a number'}, got "
                                             f"{text!r}") from None
        if kind is float and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        below = low is not None and (value <= low if low_open else value < low)
        above = high is not None and (value >= high if high_open else value > high)
        if below or above:
            bounds = [f"{'greater than' if low_open else 'at least'} {low:g}"] if low is not None else []
            bounds += [f"{'less than' if high_open else 'at most'} {high:g}"] if high is not None else []
            raise argparse.ArgumentTypeError(f"{text} must be {' and '.join(bounds)}")
        return value
    parse.__name__ = kind.__name__
    return parse


def add_zoo_argument(parser: argparse.ArgumentParser, *, positional: bool = True) -> None:
    """The zoo root, the same argument in every command that reads a zoo: a local folder or a Hub dataset repo
    id, with `--config` (optional when the root holds one config) and `--revision` (Hub only)."""
    what = "zoo root: a local folder or a Hub dataset repo id (owner/name)"
    if positional:
        parser.add_argument("root", metavar="ZOO", help=what)
    else:
        parser.add_argument("--zoo", dest="root", metavar="ZOO", required=True, help=what)
    parser.add_argument("--config", help="zoo config (default: every config of the root, or its only one)")
    parser.add_argument("--revision", help="Hub branch or commit of a repo id (default: main)")


def _add_info_parser(sub: argparse._SubParsersAction) -> None:
    """`stz info`, with the near-clone census's options."""
    info = sub.add_parser("info", help="counts, configs, splits and accuracy summary of a zoo root")
    add_zoo_argument(info)
    info.add_argument("--json", action="store_true", help="print JSON")
    info.add_argument("--clones", action="store_true",
                      help="also the near-clone census: per split, the share of runs whose nearest other training "
                           "run (weights at one epoch, raw and canonical) lies within --within, and the quantiles "
                           "of that distance")
    info.add_argument("--clone-epoch", type=bounded(int, 1),
                      help="with --clones: the epoch compared (default: the latest one every run stores)")
    info.add_argument("--within", type=bounded(float, 0, low_open=True), default=0.01,
                      help="with --clones: the distance between weight directions |w/|w| - w'/|w'|| that counts as a "
                           "clone (default: 0.01)")
    info.add_argument("--raw-only", action="store_true", help="with --clones: skip the canonical forms (faster)")
    info.set_defaults(func=cmd_info)


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(prog="stz", description="Small Transformer Zoo: build, load, check and "
                                                             "benchmark zoos of trained transformers.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {package_version()}")
    sub = parser.add_subparsers(dest="command")

    _add_info_parser(sub)

    verify = sub.add_parser("verify", help="check every shard's size and sha256 and the metadata's references")
    add_zoo_argument(verify)
    verify.set_defaults(func=cmd_verify)

    register = sub.add_parser("register", help="let the short name small-transformer-zoo find this root's configs "
                                               "offline (a zoo copied or moved here; builds register themselves)")
    register.add_argument("root", help="local zoo root folder")
    register.add_argument("--config", help="register only this config (default: every config of the root)")
    register.set_defaults(func=cmd_register)

    card = sub.add_parser("card", help="render the Hub dataset card (README.md) of a zoo root")
    card.add_argument("root", help="local zoo root folder")
    card.add_argument("--print", action="store_true", help="print the card instead of writing README.md")
    card.add_argument("--clones", action="store_true",
                      help="include the near-clone census of every config (reads the weights at one epoch)")
    card.add_argument("--repo", help="the Hub repo its examples load from (default: $STZ_REPO_ID or the default "
                                     "repo; `stz push` fills in the repo it pushes to)")
    card.set_defaults(func=cmd_card)

    push = sub.add_parser("push", help="upload a verified zoo root, card included, to a Hub dataset repo")
    push.add_argument("root", help="local zoo root folder")
    push.add_argument("repo_id", help="Hub dataset repo id, owner/name (created if needed)")
    push.add_argument("--private", action="store_true", help="create the repo private")
    push.add_argument("--revision", help="branch to push to (default: main)")
    push.set_defaults(func=cmd_push)

    public = sub.add_parser("public-copy", help="copy a zoo root with the labels of held-out splits withheld, to "
                                                "publish a leaderboard's zoo")
    public.add_argument("root", help="the full zoo root (kept private, for scoring)")
    public.add_argument("--out", required=True, help="new folder for the public copy")
    public.add_argument("--withhold", nargs="+", default=["test"], metavar="SPLIT",
                        help="splits whose accuracies and losses are withheld (default: test)")
    public.set_defaults(func=cmd_public_copy)

    imp = sub.add_parser("import-original", help="convert the authors' released zoo (folder, zip or Hub zip)")
    imp.add_argument("source", help="the unpacked release folder (with or without its top folder), the release "
                                    ".zip, or hf://datasets/<owner>/<name>/<file>.zip")
    imp.add_argument("out", help="zoo root to write")
    imp.add_argument("--config", required=True, help="config name for the imported zoo, e.g. mnist-original")
    imp.add_argument("--task", help="mnist or agnews: which release, when SOURCE holds both (else detected)")
    imp.add_argument("--shard-size", type=bounded(int, 1), default=2048, help="checkpoints per shard (default: 2048)")
    imp.add_argument("--overwrite", action="store_true", help="replace a zoo already at OUT/CONFIG")
    imp.add_argument("--split-by", choices=("run", "family"), default="run",
                     help="run: each run's split by a hash of its id; family: runs that differ only in L2 and init "
                          "std share a split (the release gave every run one seed, so those runs are near-clones) "
                          "(default: run)")
    imp.add_argument("--no-progress", action="store_true", help="no progress bar")
    imp.set_defaults(func=cmd_import_original)

    export = sub.add_parser("export-original", help="write a zoo in the authors' release layout (one .pt per "
                                                    "checkpoint and the metadata CSV), for code that reads only it")
    export.add_argument("root", help="zoo root (a local folder)")
    export.add_argument("--config", help="the zoo's config (default: the root's only one)")
    export.add_argument("--out", required=True, help="folder to write the release's top folder (or zip) into")
    export.add_argument("--zip", action="store_true", help="write <top>.zip, as the Hub ships the release")
    export.add_argument("--overwrite", action="store_true", help="replace an export already at the target")
    export.add_argument("--no-progress", action="store_true", help="no progress bar")
    export.set_defaults(func=cmd_export_original)

    for entry in entry_points(group="stz.commands"):
        entry.load()(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Exit codes: 0 done, 1 a problem in the data, files or network, 2 a bad argument (argparse's code too)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as stop:  # --help, --version and bad arguments (one line, code 2) end here
        return int(stop.code or 0)
    # huggingface_hub's retry warnings would break the one-line rule; it sets its level when first imported
    # (from HF_HUB_VERBOSITY), which happens only once a command needs it.
    os.environ.setdefault("HF_HUB_VERBOSITY", "error")
    if not sys.stderr.isatty():  # a log: no bar redrawn with ANSI codes, `datasets`' "Generating ..." ones included
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    logging.getLogger("huggingface_hub").setLevel(logging.ERROR)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except DataError as exc:  # before OSError: a zoo that is not found is both
        return _fail(args.command, exc, 1)
    except OSError as exc:
        return _fail(args.command, os_error_text(exc), 1)
    except ValueError as exc:
        return _fail(args.command, exc, 2)
    except KeyboardInterrupt:
        return _fail(args.command, "interrupted", 130)


def _fail(command: str, problem: object, code: int) -> int:
    """One line on stderr, however long or multi-line the message; the library's "argument `name`" is shown as
    the command's flag `--name`."""
    text = re.sub(r"argument `(\w+)`", lambda m: "--" + m.group(1).replace("_", "-"), " ".join(str(problem).split()))
    print(f"stz {command}: error: {text}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
