"""Where Transformer-NFN's gap to STATNN comes from: one plan built with shared and with per-run seeds, benchmarked
under four conditions, with the near-clones each condition leaves between its test and training runs.

    python benchmarks/seeding_experiment.py ZOO_ROOT --shared CONFIG --per-run CONFIG --out DIR [--seeds 3]

Conditions (each `stz bench --protocol paper` on the same models and seeds, in this order):

- `shared-run`: the shared-seed zoo as built, split by run;
- `per-run-run`: the per-run-seed zoo as built, split by run;
- `shared-run-interfaces`: the shared-seed zoo, every checkpoint moved by a random permutation of the features
  between blocks and before the classifier, an exact symmetry outside the paper's group;
- `shared-family`: the shared-seed zoo's runs split again so that runs differing only in L2 and init std share a
  split.

Printed: per condition the test runs, the share of them with a training run within 1% (relative distance, the
weights the models see), every model's tau with its 95% interval over test runs, and the paired differences that
decide the question. Each condition's results also land under OUT/<condition>/ as `stz bench` writes them, and a
stopped run resumes its finished fits.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nfn_baselines.bench.data import read_bench_data  # noqa: E402
from nfn_baselines.bench.runs import BenchRequest, run_bench  # noqa: E402
from small_transformer_zoo import Zoo  # noqa: E402
from small_transformer_zoo.store.census import nearest_distances  # noqa: E402

MODELS = ["transformer_nfn", "transformer_nfn_paper", "statnn", "statnn_invariant", "nearest_run", "hyperparameters"]
PAIRS = [("transformer_nfn", "statnn"), ("transformer_nfn_paper", "statnn"),
         ("transformer_nfn_paper", "transformer_nfn"), ("statnn_invariant", "statnn"),
         ("transformer_nfn", "hyperparameters")]


def conditions(shared: str, per_run: str) -> list[tuple[str, str, dict]]:
    """(name, config, request options), in the order they run."""
    return [("shared-run", shared, {}), ("per-run-run", per_run, {}),
            ("shared-run-interfaces", shared, {"randomize": "interfaces"}),
            ("shared-family", shared, {"split_by": "family"})]


def clone_share(zoo: Zoo, request: BenchRequest) -> tuple[int, float, float]:
    """Test runs of the condition, the share with a training run within 1%, and the median distance."""
    data = read_bench_data(zoo, request.data_selection())
    distances = nearest_distances(data.splits["test"].params, data.splits["train"].params)
    return data.splits["test"].run_count, float(np.mean(distances <= 0.01)), float(np.median(distances))


def interval(cell: dict, sign: str = "") -> str:
    """`estimate [low, high]`, or `-` where the figure is undefined (a condition too small, constant predictions)."""
    if any(cell.get(k) is None for k in ("estimate", "low", "high")):
        return "-"
    return f"{cell['estimate']:{sign}.3f} [{cell['low']:{sign}.3f}, {cell['high']:{sign}.3f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root")
    parser.add_argument("--shared", required=True, help="config of the shared-seed zoo")
    parser.add_argument("--per-run", required=True, help="config of the per-run-seed zoo")
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30, help="epochs of the package's neural models")
    parser.add_argument("--only", nargs="+", help="run only these conditions")
    parser.add_argument("--paper-recipe", action="store_true",
                        help="also train transformer_nfn_paper (50 epochs; about twice the package NFN's time)")
    parser.add_argument("--render", action="store_true", help="train nothing: print the table of what OUT holds")
    parser.add_argument("--plot", help="also draw each model's tau per condition, with its interval, to this PNG")
    args = parser.parse_args()
    out = Path(args.out)
    models = [m for m in MODELS if args.paper_recipe or m != "transformer_nfn_paper"]
    for name, config, options in conditions(args.shared, args.per_run):
        if args.render or (args.only and name not in args.only):
            continue
        zoo = Zoo.open(args.root, config)
        request = BenchRequest(models=models, seeds=args.seeds, epochs=args.epochs, protocol="paper",
                               thresholds=(), **options)
        runs, within, median = clone_share(zoo, request)
        outcome = run_bench(zoo, request, out / name)
        print(outcome.markdown, flush=True)
        (out / name / "clones.json").write_text(json.dumps({"runs": runs, "within": within, "median": median,
                                                            "results": str(outcome.paths["json"])}))
    rows = {}
    for name, _, _ in conditions(args.shared, args.per_run):
        if (out / name / "clones.json").is_file():
            clones = json.loads((out / name / "clones.json").read_text())
            rows[name] = {**clones, "models": json.loads(Path(clones["results"]).read_text())["models"]}
    render(rows, args.seeds)
    if args.plot and rows:
        print(f"wrote {plot(rows, Path(args.plot))}")


def plot(rows: dict[str, dict], path: Path) -> Path:
    """Tau of every model under every condition, 95% intervals over test runs as error bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(rows)
    models = [m for m in MODELS if any(m in rows[n]["models"] for n in names)]
    width = 0.8 / len(models)
    figure, axes = plt.subplots(figsize=(9, 4))
    for k, model in enumerate(models):
        cells = [rows[n]["models"].get(model, {}).get("columns", {}).get("tau") for n in names]
        xs = [i + (k - (len(models) - 1) / 2) * width for i in range(len(names))]
        est = [c["estimate"] if c and c["estimate"] is not None else float("nan") for c in cells]
        low = [e - c["low"] if c and c["low"] is not None else 0.0 for e, c in zip(est, cells)]
        high = [c["high"] - e if c and c["high"] is not None else 0.0 for e, c in zip(est, cells)]
        axes.bar(xs, est, width, yerr=[low, high], capsize=2, label=model)
    axes.set_xticks(range(len(names)))
    axes.set_xticklabels([f"{n}\n({rows[n]['runs']} test runs)" for n in names])
    axes.set_ylabel("Kendall's tau (95% interval over test runs)")
    axes.axhline(0, color="black", linewidth=0.5)
    axes.legend(fontsize=7, ncol=3)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def render(rows: dict[str, dict], seeds: int) -> None:
    names = list(rows)
    print(f"\n{seeds} seeds; tau over each condition's test runs (paper protocol, all checkpoints of the epoch), "
          f"95% intervals from 1,000 bootstrap resamples of the test runs.\n")
    print("| | " + " | ".join(names) + " |")
    print("|---|" + "---|" * len(names))
    print("| test runs | " + " | ".join(str(rows[n]["runs"]) for n in names) + " |")
    print("| test runs with a training run within 1% | " + " | ".join(
        f"{100 * rows[n]['within']:.0f}% (median distance {rows[n]['median']:.2f})" for n in names) + " |")
    for model in MODELS:
        print(f"| {model}, tau | " + " | ".join(interval(rows[n]["models"][model]["columns"]["tau"])
                                               if model in rows[n]["models"] else "not run" for n in names) + " |")
    for a, b in PAIRS:
        cells = []
        for n in names:
            if a not in rows[n]["models"] or b not in rows[n]["models"]:
                cells.append("not run")
                continue
            d = rows[n]["models"][a]["differences"][b]
            cells.append(interval(d, "+") + (", tied" if d["tied"] else ""))
        print(f"| {a} minus {b} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
