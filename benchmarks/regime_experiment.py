"""Does a model's standing against STATNN depend on how well the zoo's networks are trained, or on how they were
seeded? A 2 x 2 of zoos read from `seeding_experiment.py` results: two training regimes (for example `families`,
mostly under-trained, and `trained`, the paper's regime) each built with per-run seeds and with one shared seed.

    python benchmarks/regime_experiment.py ZOO_ROOT \
        --cell families per-run bench/seeding/mnist-families/run \
        --cell families shared bench/seeding/mnist-families-shared-seed/run \
        --cell trained per-run bench/trained/mnist-trained/run \
        --cell trained shared bench/trained/mnist-trained-shared-seed/run

Each `--cell REGIME SEEDING DIR` names a folder holding a `scores.json` written by `seeding_experiment.py` (one zoo,
one condition); a cell given twice takes the models of both folders. Printed: each zoo's training quality at the protocol's epoch; per model pair (STATNN the reference)
the paired difference in each cell, 95% interval over that zoo's test runs; then the regime's effect on each
difference (trained minus under-trained, per seeding) and the seeding's effect (shared minus per-run, per regime),
unpaired because the zoos are independent populations. An interval that holds 0 is "not decided", with the test
runs that would decide it if the difference stayed as measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from seeding_experiment import (  # noqa: E402
    difference, figure, gap_between, protocol_accuracies, runs_to_decide, trained)

from small_transformer_zoo import Zoo  # noqa: E402

PAIRS = [("transformer_nfn", "statnn"), ("transformer_nfn_paper", "statnn"), ("probegen", "statnn"),
         ("statnn_probe", "statnn"), ("statnn", "hyperparameters")]
THRESHOLDS = (0.5, 0.8)


def read_cells(specs: list[list[str]]) -> dict[tuple[str, str], dict]:
    """(regime, seeding) -> the cell's scores. A cell named again with another folder of the same zoo and test runs
    (another run of the script, on the same bootstrap resamples) adds the models that folder trained; a folder
    without scores.json, or one of another zoo, is an error naming it."""
    cells: dict[tuple[str, str], dict] = {}
    for regime, seeding, folder in specs:
        path = Path(folder) / "scores.json"
        if not path.is_file():
            raise SystemExit(f"{path}: no scores here; run seeding_experiment.py for this zoo first")
        scores = json.loads(path.read_text())
        known = cells.setdefault((regime, seeding), scores)
        if known is not scores:
            if (known["config"], known["runs"]) != (scores["config"], scores["runs"]):
                raise SystemExit(f"{path}: zoo {scores['config']!r} with {scores['runs']} test runs, but cell "
                                 f"{regime} {seeding} holds {known['config']!r} with {known['runs']}")
            known["models"] = {**scores["models"], **known["models"]}
    return cells


def accuracy_profile(root: str, config: str) -> dict[str, float]:
    """Test accuracy of every run at the paper protocol's epoch: median, 90th percentile, top and the share above
    each of THRESHOLDS."""
    epoch, values = protocol_accuracies(Zoo.open(root, config))
    profile = {"epoch": epoch, "runs": int(values.size), "median": float(np.median(values)),
               "p90": float(np.quantile(values, 0.9)), "top": float(values.max())}
    return profile | {f"above {t}": float(np.mean(values > t)) for t in THRESHOLDS}


def zoo_table(root: str, cells: dict[tuple[str, str], dict]) -> str:
    """Each cell's zoo: its accuracy profile at the protocol's epoch and its test runs."""
    lines = ["## The zoos (test accuracy of every run at the paper protocol's epoch)", "",
             "| regime | seeding | zoo | epoch | runs | median | 90th percentile | top | "
             + " | ".join(f"above {t}" for t in THRESHOLDS) + " | test runs |",
             "|---|---|---|---|---|---|---|---|" + "---|" * len(THRESHOLDS) + "---|"]
    for (regime, seeding), scores in cells.items():
        p = accuracy_profile(root, scores["config"])
        lines.append(f"| {regime} | {seeding} | `{scores['config']}` | {p['epoch']} | {p['runs']} | {p['median']:.3f} | "
                     f"{p['p90']:.3f} | {p['top']:.3f} | "
                     + " | ".join(f"{100 * p[f'above {t}']:.0f}%" for t in THRESHOLDS) + f" | {scores['runs']} |")
    return "\n".join(lines)


def difference_tables(cells: dict[tuple[str, str], dict]) -> str:
    """Per model pair: its paired difference in every cell, the regime's effect per seeding and the seeding's
    effect per regime."""
    regimes = list(dict.fromkeys(r for r, _ in cells))
    seedings = list(dict.fromkeys(s for _, s in cells))
    lines: list[str] = []
    for a, b in PAIRS:
        present = {key: s for key, s in cells.items() if trained([s], a) and trained([s], b)}
        if not present:
            continue
        header = ["seeding", *regimes] + ([f"{regimes[1]} minus {regimes[0]} (unpaired)"] if len(regimes) == 2 else [])
        lines += [f"## {a} minus {b} (paired inside each zoo)", "", "| " + " | ".join(header) + " |",
                  "|" + "---|" * len(header)]
        for seeding in seedings:
            row = []
            for regime in regimes:
                s = present.get((regime, seeding))
                d = difference([s], a, [s], b) if s else None
                row.append("-" if d is None else figure(d, "+") + (", tied" if d["tied"] else ""))
            if len(regimes) == 2:
                pair = [present.get((r, seeding)) for r in regimes]
                row.append(_gap(pair[1], pair[0], a, b))
            lines.append(f"| {seeding} | " + " | ".join(row) + " |")
        if len(seedings) == 2:
            pairs = [(present.get((regime, seedings[1])), present.get((regime, seedings[0]))) for regime in regimes]
            lines += ["", f"{seedings[1]} minus {seedings[0]}, per regime (unpaired): " + "; ".join(
                f"{regime} {_gap(x, y, a, b)}" for regime, (x, y) in zip(regimes, pairs))]
        lines.append("")
    return "\n".join(lines)


def _gap(a: dict | None, b: dict | None, model: str, reference: str) -> str:
    """(model minus reference) on zoo `a` minus on zoo `b`, with its verdict."""
    if a is None or b is None:
        return "-"
    d = gap_between([a], [b], model, reference)
    runs = {f"in `{zoo['config']}`": zoo["runs"] for zoo in (a, b)}
    return f"{figure(d, '+')}: {runs_to_decide(d, runs)}"


def plot(cells: dict[tuple[str, str], dict], path: Path) -> Path:
    """Each model pair's paired difference in every zoo: one panel per pair, the regimes along x, one bar per
    seeding, 95% intervals over the zoo's test runs as error bars."""
    from small_transformer_zoo.plots import new_figure, save_figure

    regimes = list(dict.fromkeys(r for r, _ in cells))
    seedings = list(dict.fromkeys(s for _, s in cells))
    pairs = [(a, b) for a, b in PAIRS if any(trained([s], a) and trained([s], b) for s in cells.values())]
    figure_, axes = new_figure(1, len(pairs), (3.4 * len(pairs), 3.6))
    width = 0.8 / len(seedings)
    for axis, (a, b) in zip(np.ravel(axes), pairs):
        for k, seeding in enumerate(seedings):
            shown = [(i, cells[(r, seeding)]) for i, r in enumerate(regimes) if (r, seeding) in cells
                     and trained([cells[(r, seeding)]], a) and trained([cells[(r, seeding)]], b)]
            ds = [difference([s], a, [s], b) for _, s in shown]
            axis.bar([i + (k - (len(seedings) - 1) / 2) * width for i, _ in shown], [d["estimate"] for d in ds],
                     width, yerr=[[d["estimate"] - d["low"] for d in ds], [d["high"] - d["estimate"] for d in ds]],
                     capsize=2, color=f"C{k}", label=seeding)
        axis.set_xticks(range(len(regimes)))
        axis.set_xticklabels(regimes)
        axis.axhline(0, color="black", linewidth=0.5)
        axis.set_title(f"{a} minus {b}", fontsize=8)
    np.ravel(axes)[0].set_ylabel("difference in Kendall's tau (95% interval)")
    np.ravel(axes)[0].legend(fontsize=7)
    return save_figure(figure_, "Paired differences per zoo: regime against seeding", path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root")
    parser.add_argument("--cell", nargs=3, action="append", required=True, metavar=("REGIME", "SEEDING", "DIR"),
                        help="a zoo's seeding_experiment.py folder (one condition) and its place in the table")
    parser.add_argument("--plot", help="also draw every pair's difference per zoo to this PNG")
    args = parser.parse_args()
    cells = read_cells(args.cell)
    print(zoo_table(args.root, cells) + "\n")
    print(difference_tables(cells))
    if args.plot:
        print(f"wrote {plot(cells, Path(args.plot))}")


if __name__ == "__main__":
    main()
