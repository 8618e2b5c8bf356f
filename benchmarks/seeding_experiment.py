"""Where Transformer-NFN's standing against STATNN comes from: one plan built under every seed policy (shared with
several base seeds), each zoo benchmarked under the conditions that could refute an answer.

    python benchmarks/seeding_experiment.py ZOO_ROOT --out DIR --per-run CONFIG [--shared CONFIG ...] \
        [--shared-init CONFIG] [--shared-data CONFIG] [--seeds 3] [--paper-recipe] [--models M ...] \
        [--conditions C ...]

Conditions (each `stz bench --protocol paper` on the same models and seeds):

- `run`: the zoo as built, split by run (every zoo);
- `interfaces`: every checkpoint moved by a random permutation of the features between blocks and before the
  classifier, an exact symmetry outside the paper's group (every zoo; on the per-run zoo this is the control:
  where no index alignment exists, a model that reads it has nothing to lose);
- `family`: runs that differ only in L2 and init std share a split (the zoos with a shared stream);
- `cutoff`: the authors' benchmark data, checkpoints below 0.1 test accuracy dropped (the per-run zoo and the
  first shared zoo).

Printed: each zoo's training quality (test accuracy of its runs at the protocol's epoch), then per zoo and
condition the test runs, the share with a training run within 1%, every model's tau with its 95% interval over
test runs and the paired differences inside the zoo; then the shared zoos pooled over their base seeds: the mean of
the zoos' figures, its interval from resampling each zoo's test runs (a stratified bootstrap over the pooled test
runs). `run` and `interfaces` hold the same test runs, so the loss to the randomised interfaces is paired too. A
difference whose interval holds 0 is "not decided", with the test runs that would decide it if the difference
stayed as measured. Results land under OUT/<config>/<condition>/ as `stz bench` writes them, with a `scores.json`
of the resampled figures and each model's fit seconds; a condition scored with every model asked for is read back,
not trained again (one that lacks a model asked for trains again with those asked for and those it holds; `--fresh`
trains it again), a stopped run resumes its finished fits, and `--render` trains nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nfn_baselines.bench.data import read_bench_data  # noqa: E402
from nfn_baselines.bench.protocols import paper_epoch  # noqa: E402
from nfn_baselines.bench.runs import BenchRequest, run_bench  # noqa: E402
from nfn_baselines.models.metrics import paired_difference, percentile_interval  # noqa: E402
from small_transformer_zoo import Zoo  # noqa: E402
from small_transformer_zoo.store.census import nearest_distances  # noqa: E402

MODELS = ["transformer_nfn", "transformer_nfn_paper", "transformer_nfn_interfaces", "statnn", "statnn_invariant",
          "statnn_probe", "probegen", "nearest_run", "hyperparameters"]
PAIRS = [("transformer_nfn", "statnn"), ("transformer_nfn_paper", "statnn"),
         ("transformer_nfn_paper", "transformer_nfn"), ("transformer_nfn_interfaces", "statnn"),
         ("transformer_nfn_interfaces", "transformer_nfn"), ("probegen", "statnn"), ("statnn_probe", "statnn"),
         ("statnn_invariant", "statnn"), ("transformer_nfn", "hyperparameters"), ("statnn", "hyperparameters")]
CONDITIONS = {"run": {}, "interfaces": {"randomize": "interfaces"}, "family": {"split_by": "family"},
              "cutoff": {"where": {"test_accuracy": (0.1, 1.0)}}}
CUTOFF = 0.1


def plan(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    """(role, config, condition) in the order they run."""
    out = [("per-run", args.per_run, c) for c in ("run", "interfaces", "cutoff")]
    for index, config in enumerate(args.shared):
        out += [("shared", config, c) for c in ("run", "interfaces", "family") + (("cutoff",) if index == 0 else ())]
    for role in ("shared-init", "shared-data"):
        config = getattr(args, role.replace("-", "_"))
        if config:
            out += [(role, config, c) for c in ("run", "interfaces", "family")]
    return out


def chosen_models(args: argparse.Namespace) -> list[str]:
    """The models asked for: `--models`, else all of MODELS (the paper recipe only with `--paper-recipe`)."""
    return args.models or [m for m in MODELS if args.paper_recipe or m != "transformer_nfn_paper"]


def models_to_train(stored: dict | None, condition: str, args: argparse.Namespace) -> list[str]:
    """The models a condition trains now: none when only rendering, when the condition is not among
    `--conditions`, or when its stored scores hold every model asked for; else those asked for together with those
    it already holds (all trained again in one run, so the condition's fits stay one run and nothing scored is
    lost). `--fresh` trains what is asked for, whatever is stored."""
    if args.render or (args.conditions and condition not in args.conditions):
        return []
    asked = chosen_models(args)
    if stored is None or args.fresh:
        return asked
    held = set(stored["models"])
    return [] if held >= set(asked) else [m for m in MODELS if m in held or m in asked]


def protocol_accuracies(zoo: Zoo) -> tuple[int, np.ndarray]:
    """The paper protocol's epoch and the test accuracy of every run there, all splits."""
    epoch = paper_epoch(zoo)
    values = []
    for split in zoo.splits:
        table = zoo.metadata(split).to_pandas()
        values += table[(table.epoch == epoch) & ~table.is_best].test_accuracy.tolist()
    return epoch, np.asarray(values, dtype=float)


def quality(zoo: Zoo) -> dict[str, float]:
    """Test accuracy of the zoo's runs at the paper protocol's epoch: quartiles, and the share below the cut-off."""
    epoch, accuracy = protocol_accuracies(zoo)
    q1, median, q3 = np.quantile(accuracy, [0.25, 0.5, 0.75])
    return {"epoch": epoch, "runs": int(accuracy.size), "q1": float(q1), "median": float(median), "q3": float(q3),
            "below_cutoff": float(np.mean(accuracy < CUTOFF)), "above_half": float(np.mean(accuracy > 0.5))}


def run_condition(root: str, config: str, condition: str, out: Path, args: argparse.Namespace,
                  models: list[str]) -> dict:
    """One (zoo, condition): the benchmark of `models`, its near-clone census and every model's resampled tau,
    stored."""
    zoo = Zoo.open(root, config)
    request = BenchRequest(models=models, seeds=args.seeds, epochs=args.epochs, protocol="paper",
                           thresholds=(), **CONDITIONS[condition])
    data = read_bench_data(zoo, request.data_selection())
    distances = nearest_distances(data.splits["test"].params, data.splits["train"].params)
    outcome = run_bench(zoo, request, out)
    print(outcome.markdown, flush=True)
    seconds = json.loads(outcome.paths["json"].read_text()).get("fit_seconds", {})
    scores = {"config": config, "condition": condition, "runs": data.splits["test"].run_count,
              "within": float(np.mean(distances <= 0.01)), "median_distance": float(np.median(distances)),
              "quality": quality(zoo), "results": str(outcome.paths["json"]),
              "models": {m: {"estimate": cells["tau"].estimate, "values": cells["tau"].values.tolist(),
                             "seconds": sum(seconds.get(m, {}).values())}
                         for m, cells in outcome.report.cells.items()}}
    (out / "scores.json").write_text(json.dumps(scores))
    return scores


def figure(cell: dict | None, sign: str = "") -> str:
    if not cell or not all(math.isfinite(cell.get(k, math.nan)) for k in ("estimate", "low", "high")):
        return "-"
    return f"{cell['estimate']:{sign}.3f} [{cell['low']:{sign}.3f}, {cell['high']:{sign}.3f}]"


def decide_scale(difference: dict) -> float | None:
    """How many times the test runs would make the interval exclude 0 if the difference stayed at its estimate
    (the half-width shrinks as 1/sqrt(runs)); None where there is nothing to scale."""
    half = (difference["high"] - difference["low"]) / 2
    if not math.isfinite(half) or abs(difference["estimate"]) < 1e-9:
        return None
    return (half / abs(difference["estimate"])) ** 2


def runs_to_decide(difference: dict, runs: dict[str, int]) -> str:
    """"decided", or "not decided" with the test runs (per named group, `runs`) that would decide it."""
    if not difference["decided"]:
        return "no interval (the metric is undefined on most resamples)"
    if not difference["tied"]:
        return "decided"
    scale = decide_scale(difference)
    if scale is None:
        return "not decided (no difference to detect)"
    needed = " and ".join(f"{math.ceil(count * scale):,}{f' {name}' if name else ''}" for name, count in runs.items())
    return f"not decided (about {needed} test runs would decide it)"


def combine(scores: list[dict], model: str) -> tuple[float, np.ndarray]:
    """A model's pooled figure over zoos: the mean of their estimates, and per resample the mean of their values
    (each zoo's test runs resampled on their own: a stratified bootstrap)."""
    return (float(np.mean([s["models"][model]["estimate"] for s in scores])),
            np.mean([np.asarray(s["models"][model]["values"], dtype=float) for s in scores], axis=0))


def cell(scores: list[dict], model: str) -> dict:
    estimate, values = combine(scores, model)
    low, high = percentile_interval(values)
    return {"estimate": estimate, "low": low, "high": high}


def difference(a: list[dict], model_a: str, b: list[dict], model_b: str) -> dict:
    """model_a on `a` minus model_b on `b` (the same test runs and resamples: paired)."""
    (ea, va), (eb, vb) = combine(a, model_a), combine(b, model_b)
    return paired_difference(va, vb, ea, eb)


def trained(scores: list[dict], model: str) -> bool:
    return all(model in s["models"] for s in scores)


def gap_between(a: list[dict], b: list[dict], model: str, reference: str) -> dict:
    """(model minus reference) on the zoos `a` minus the same on the zoos `b`: unpaired, since the zoos are
    independent populations, so `b`'s resamples are taken in a shuffled order (a fixed seed) before subtracting."""
    (ea, va), (er, vr) = combine(a, model), combine(a, reference)
    (eb, vb), (es, vs) = combine(b, model), combine(b, reference)
    order = np.random.default_rng(1).permutation(len(vb))
    return paired_difference(va - vr, (vb - vs)[order], ea - er, eb - es)


def between_zoos(table: dict[tuple[str, str], dict], per_run: str, shared: list[str]) -> list[str]:
    """How much a gap between two models changes from the per-run zoo to the shared zoos (pooled), per condition."""
    lines = []
    for condition in CONDITIONS:
        if (per_run, condition) not in table or not all((c, condition) in table for c in shared):
            continue
        a, b = [table[(c, condition)] for c in shared], [table[(per_run, condition)]]
        for model, reference in [PAIRS[0], ("transformer_nfn", "hyperparameters"), ("statnn", "hyperparameters")]:
            if trained(a, model) and trained(a, reference) and trained(b, model) and trained(b, reference):
                d = gap_between(a, b, model, reference)
                verdict = runs_to_decide(d, {"shared": sum(s["runs"] for s in a), "per-run": b[0]["runs"]})
                lines.append(f"- `{condition}`, ({model} minus {reference}) on the shared zoos minus on the per-run "
                             f"zoo: {figure(d, '+')}: {verdict}")
    if not lines:
        return []
    return ["", f"## Between the per-run zoo and the shared zoos pooled over {len(shared)} base seeds", "",
            "Unpaired (independent populations; each zoo's test runs resampled on their own):", "", *lines]


def fit_seconds(rows: dict[str, list[dict]], model: str) -> str:
    """A model's cost: its fits' training seconds over all seeds, the mean over the zoos and conditions that
    trained it."""
    seconds = [s["models"][model].get("seconds", math.nan) for scores in rows.values() if trained(scores, model)
               for s in scores]
    return f"{np.mean(seconds):.0f} s to fit" if seconds and np.all(np.isfinite(seconds)) else "fit time not kept"


def render(table: dict[tuple[str, str], dict], shared: list[str], per_run: str) -> str:
    lines = ["## Training quality (test accuracy of each run at the protocol's epoch)", "",
             "| zoo | runs | median [quartiles] | below 0.1 | above 0.5 |", "|---|---|---|---|---|"]
    for config in dict.fromkeys(c for c, _ in table):
        q = next(s for (c, _), s in table.items() if c == config)["quality"]
        lines.append(f"| `{config}` | {q['runs']} | {q['median']:.3f} [{q['q1']:.3f}, {q['q3']:.3f}] | "
                     f"{100 * q['below_cutoff']:.0f}% | {100 * q['above_half']:.0f}% |")
    groups = [(f"`{config}`", [config]) for config in dict.fromkeys(c for c, _ in table)]
    if len(shared) > 1:
        groups.append((f"shared, pooled over {len(shared)} base seeds", shared))
    for title, configs in groups:
        conditions = [n for n in CONDITIONS if all((c, n) in table for c in configs)]
        rows = {n: [table[(c, n)] for c in configs] for n in conditions}
        runs = {n: sum(s["runs"] for s in rows[n]) for n in conditions}
        models = [m for m in MODELS if any(trained(rows[n], m) for n in conditions)]
        lines += ["", f"## {title}", "", "| | " + " | ".join(conditions) + " |", "|---|" + "---|" * len(conditions),
                  "| test runs | " + " | ".join(str(runs[n]) for n in conditions) + " |",
                  "| test runs with a training run within 1% | " + " | ".join(
                      f"{100 * np.mean([s['within'] for s in rows[n]]):.0f}%" for n in conditions) + " |"]
        lines += [f"| {m}, tau ({fit_seconds(rows, m)}) | " + " | ".join(
            figure(cell(rows[n], m)) if trained(rows[n], m) else "not trained" for n in conditions) + " |"
            for m in models]
        for a, b in PAIRS:
            cells = [difference(rows[n], a, rows[n], b) if trained(rows[n], a) and trained(rows[n], b) else None
                     for n in conditions]
            if any(cells):
                lines.append(f"| {a} minus {b} | " + " | ".join(
                    "-" if d is None else figure(d, "+") + ("" if not d["tied"] else ", tied") for d in cells) + " |")
        if "interfaces" in conditions:
            lines += ["", f"Loss to the randomised interfaces (tau under `run` minus under `interfaces`, the same "
                          f"{runs['run']} test runs, paired):", ""]
            for m in [m for m in models if trained(rows["run"], m) and trained(rows["interfaces"], m)]:
                d = difference(rows["run"], m, rows["interfaces"], m)
                lines.append(f"- {m}: {figure(d, '+')}: {runs_to_decide(d, {'': runs['run']})}")
        if "run" in conditions:
            lines += ["", "Inside the `run` condition:", ""]
            for a, b in PAIRS[:2] + [PAIRS[3], PAIRS[5], PAIRS[6]]:
                if trained(rows["run"], a) and trained(rows["run"], b):
                    d = difference(rows["run"], a, rows["run"], b)
                    lines.append(f"- {a} minus {b}: {figure(d, '+')}: {runs_to_decide(d, {'': runs['run']})}")
    if shared:
        lines += between_zoos(table, per_run, shared)
    return "\n".join(lines)


def plot(table: dict[tuple[str, str], dict], path: Path) -> Path:
    """Tau of every model per zoo, one panel per condition, 95% intervals over test runs as error bars."""
    from small_transformer_zoo.plots import new_figure, save_figure

    conditions = [n for n in CONDITIONS if any(c == n for _, c in table)]
    configs = list(dict.fromkeys(c for c, _ in table))
    stem = min(configs, key=len)
    figure_, axes = new_figure(1, len(conditions), (4.2 * len(conditions), 4.2))
    shown = [m for m in MODELS if any(m in scores["models"] for scores in table.values())]
    width = 0.8 / len(shown)
    for axis, condition in zip(np.ravel(axes), conditions):
        present = [c for c in configs if (c, condition) in table]
        for k, model in enumerate(shown):
            cells = [cell([table[(c, condition)]], model) if model in table[(c, condition)]["models"] else None
                     for c in present]
            xs = [i + (k - (len(shown) - 1) / 2) * width for i in range(len(present))]
            est = [c["estimate"] if c else math.nan for c in cells]
            errors = [[e - c["low"] if c else 0 for e, c in zip(est, cells)],
                      [c["high"] - e if c else 0 for e, c in zip(est, cells)]]
            axis.bar(xs, est, width, yerr=np.nan_to_num(errors), capsize=1.5, label=model)
        axis.set_xticks(range(len(present)))
        axis.set_xticklabels([c.removeprefix(stem).strip("-") or "per-run" for c in present],
                             rotation=30, fontsize=7)
        axis.set_title(condition)
        axis.axhline(0, color="black", linewidth=0.5)
        axis.set_ylabel("Kendall's tau (95% interval over test runs)")
    np.ravel(axes)[0].legend(fontsize=6)
    return save_figure(figure_, "Tau per zoo and condition", path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root")
    parser.add_argument("--out", required=True)
    parser.add_argument("--per-run", required=True, help="config of the per-run-seed zoo")
    parser.add_argument("--shared", nargs="*", default=[], help="configs of the shared-seed zoos (one per base seed)")
    parser.add_argument("--shared-init", help="config of the zoo built with --seed-policy shared-init")
    parser.add_argument("--shared-data", help="config of the zoo built with --seed-policy shared-data")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=30, help="epochs of the package's neural models")
    parser.add_argument("--paper-recipe", action="store_true", help="also train transformer_nfn_paper")
    parser.add_argument("--models", nargs="+", choices=MODELS, help="train only these (default: all)")
    parser.add_argument("--conditions", nargs="+", choices=list(CONDITIONS),
                        help="only these conditions (default: all that apply to each zoo); those already scored "
                             "are always read back and shown")
    parser.add_argument("--render", action="store_true", help="train nothing: the tables of what OUT holds")
    parser.add_argument("--fresh", action="store_true", help="train every condition again, even one already scored")
    parser.add_argument("--plot", help="also draw tau per zoo and condition to this PNG")
    args = parser.parse_args()
    out = Path(args.out)
    table = {}
    for _, config, condition in plan(args):
        folder = out / config / condition
        stored = json.loads((folder / "scores.json").read_text()) if (folder / "scores.json").is_file() else None
        models = models_to_train(stored, condition, args)
        if models:
            table[(config, condition)] = run_condition(args.root, config, condition, folder, args, models)
        elif stored is not None:
            table[(config, condition)] = stored
    shared = [c for c in args.shared if (c, "run") in table]
    print(f"\n{args.seeds} seeds per model, a fit's cost the training seconds of all its seeds; tau over each "
          f"condition's test runs (paper protocol), 95% intervals from 1,000 bootstrap resamples of the test runs.\n")
    print(render(table, shared, args.per_run))
    if args.plot and table:
        print(f"\nwrote {plot(table, Path(args.plot))}")


if __name__ == "__main__":
    main()
