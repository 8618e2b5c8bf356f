"""Paired differences between models of one finished `stz bench` run, in every tau column (each threshold's
condition included), read back from the run's stored fits: nothing is trained.

    python benchmarks/bench_differences.py zoos --config mnist-trained bench/trained/thresholds \
        --pairs transformer_nfn:statnn statnn_probe:statnn statnn:hyperparameters

The benchmark's own table gives each model's interval per column and the paired difference with the best model in
the main column only; this gives any pair in every column, on the run's bootstrap resamples of the test runs (the
same draws for both models, so the interval is paired).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the project; not `common`, whose loopback Hub
# environment would leak into the tests that import this script

from nfn_baselines.bench.request import BenchRequest  # noqa: E402
from nfn_baselines.bench.runs import bench_store, run_bench  # noqa: E402
from nfn_baselines.models.metrics import paired_difference, too_few_runs  # noqa: E402
from small_transformer_zoo import Zoo  # noqa: E402


def finished_run(folder: Path, config: str) -> tuple[BenchRequest, set[str]]:
    """The request and the table's models of the finished paper- or all-checkpoints-protocol run in `folder` for
    `config`."""
    found = sorted(folder.glob(f"{config}-bench*.json"))
    if len(found) != 1:
        raise FileNotFoundError(f"{folder}: expected one `{config}-bench*.json` of a finished `stz bench` run, "
                                f"found {[p.name for p in found]}")
    table = json.loads(found[0].read_text())
    request = table["request"]
    request["thresholds"] = tuple(request["thresholds"])
    return BenchRequest(**request), set(table["models"])


def column_differences(zoo: Zoo, folder: Path, pairs: list[tuple[str, str]]) -> list[str]:
    """One line per pair and tau column: `a minus b` with its paired 95% interval and whether it holds 0."""
    request, models = finished_run(folder, zoo.config)
    if missing := sorted({name for pair in pairs for name in pair} - models):
        raise ValueError(f"{folder}: no model {missing[0]!r} in its run; it has {sorted(models)}")
    store = bench_store(zoo, request, folder)
    if not store.finished:
        raise FileNotFoundError(f"{folder}: no finished run's fits for `{zoo.config}` (a stopped run, or none); "
                                f"run its `stz bench` command to the end first")
    with tempfile.TemporaryDirectory() as scratch:  # the run's folder keeps its own results as they are
        shutil.copytree(store.kept, Path(scratch) / store.kept.relative_to(folder))
        report = run_bench(zoo, request, Path(scratch)).report
    lines = []
    for a, b in pairs:
        for column in (c for c in report.columns if c.startswith("tau")):
            x, y = report.cells[a][column], report.cells[b][column]
            d = paired_difference(x.values, y.values, x.estimate, y.estimate)
            head = f"{a} minus {b}, {column} ({x.runs} test runs): "
            if too_few_runs(x.runs):
                lines.append(head + "too few runs")
            elif not d["decided"]:
                lines.append(head + "n/a (no tau for one of them: constant predictions)")
            else:
                lines.append(head + f"{d['estimate']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}]"
                             + (", tied" if d["tied"] else ""))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("root", help="the zoo root")
    parser.add_argument("--config", required=True)
    parser.add_argument("folder", type=Path, help="the finished run's --out folder")
    parser.add_argument("--pairs", nargs="+", required=True, metavar="A:B", help="model pairs, A minus B")
    args = parser.parse_args()
    pairs = [tuple(p.split(":", 1)) for p in args.pairs]
    if any(len(p) != 2 for p in pairs):
        sys.exit(f"--pairs: each pair is A:B, got {args.pairs}")
    try:
        lines = column_differences(Zoo.open(args.root, args.config), args.folder, pairs)
    except (FileNotFoundError, ValueError) as error:
        sys.exit(f"bench_differences: {error}")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
