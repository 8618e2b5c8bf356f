"""Every path of the package at the size of the authors' release, with the time and peak memory of each step.

    python benchmarks/scale_rehearsal.py --task mnist --fraction 0.125 --bench --work DIR --record scale.jsonl
    python benchmarks/scale_rehearsal.py --report scale.jsonl

One call writes a release in the authors' layout (`write_synthetic_release(..., learnable=True)`: accuracies that
the weights determine) of `fraction` times the release's checkpoints of that task (62,756 MNIST, 63,796 AG News),
then runs each step as its own process under `/usr/bin/time -v` and appends its wall time and peak RSS to the
record: import from the folder and from the zip, export it again in the release layout (folder and zip), verify, open and read every split as one tensor, the `datasets`
preparation and the cached load, a torch DataLoader over the train split, `stz push` to a loopback Hub, a fresh
load and a stream from it, (`--bench`) `stz bench` under both protocols, scoring a full submission and merging it
into a leaderboard, `stz info`, a filtered select and the card. Every file of the size is deleted at the end.
`--report` prints each step at every size measured, and its growth exponent (log time ratio / log size ratio
between the smallest and the largest size: 1 is linear); with `--plot FILE.png` it also draws them on log-log axes
beside a linear slope.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

from small_transformer_zoo.testing import free_loopback_port

RELEASE = {"mnist": 62_756, "agnews": 63_796}
CONFIG = "scale"
REPO = "rehearsal/scale"
PROTOCOLS = ("paper", "all-checkpoints")
BENCH_MODELS = ("transformer_nfn", "statnn", "xgboost")
BENCH = ["--seeds", "1", "--epochs", "2", "--thresholds", "--device", "cpu", "--jobs", "1"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=sorted(RELEASE), default="mnist")
    parser.add_argument("--fraction", type=float, default=0.125)
    parser.add_argument("--bench", nargs="*", type=bench_plan, metavar="PROTOCOL[:MODEL,...]",
                        help="run `stz bench` too (the costliest step) under these protocols, each with the floors and "
                             f"its models (default: {','.join(BENCH_MODELS)}); the flag alone: both protocols")
    parser.add_argument("--work", type=Path, help="an empty folder on a disk with 35 GB free")
    parser.add_argument("--record", type=Path, help="JSON lines file the measurements are appended to")
    parser.add_argument("--report", type=Path, help="print the table of a record and stop")
    parser.add_argument("--plot", type=Path, help="with --report: also draw each step's time and peak RSS against "
                                                  "the size to this PNG")
    parser.add_argument("--only", nargs="+", metavar="PREFIX",
                        help="run only the steps whose labels start with these (the release is always written), "
                             "e.g. 'stz import-original (folder)' 'stz export-original'")
    parser.add_argument("--step", help=argparse.SUPPRESS)    # internal: run one in-process step
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)  # internal: the loopback Hub on this port
    args = parser.parse_args()
    if args.plot and not args.report:
        parser.error("--plot draws a record: give it with --report RECORD")
    if args.report:
        rows = [json.loads(line) for line in args.report.read_text().splitlines() if line.strip()]
        print_report(rows)
        if args.plot:
            plot_report(rows, args.plot)
    elif args.serve:
        serve(args.serve)
    elif args.step:
        STEPS[args.step](args.work, args.task)
    else:
        if args.work is None or args.record is None:
            parser.error("--work and --record are needed for a rehearsal")
        benches = [] if args.bench is None else args.bench or [bench_plan(p) for p in PROTOCOLS]
        rehearse(args.task, args.fraction, benches, args.work, args.record, args.only)


def bench_plan(value: str) -> tuple[str, tuple[str, ...]]:
    """`paper` or `paper:transformer_nfn,statnn` -> (protocol, models)."""
    protocol, _, models = value.partition(":")
    if protocol not in PROTOCOLS:
        raise argparse.ArgumentTypeError(f"unknown protocol {protocol!r}; choose from {list(PROTOCOLS)}")
    return protocol, tuple(m for m in models.split(",") if m) or BENCH_MODELS


def stz_command() -> str:
    """The `stz` installed beside this interpreter, so a run need not have its environment activated."""
    beside = shutil.which("stz", path=str(Path(sys.executable).parent))
    if beside is None:
        raise SystemExit(f"no stz beside {sys.executable}: install the package (pip install -e .) in this environment")
    return beside


def rehearse(task: str, fraction: float, benches: list[tuple[str, tuple[str, ...]]], work: Path,
             record: Path, only: list[str] | None = None) -> None:
    """Write the release, run every step under /usr/bin/time -v (`only`: the steps whose labels start with one of
    these, after the write), append what each cost, delete the files."""
    checkpoints = round(RELEASE[task] * fraction)
    work.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"HF_HOME": str(work / "hf-home"), "HF_DATASETS_CACHE": str(work / "hf-datasets"),
                        "STZ_HOME": str(work / "stz-home"), "HF_HUB_DISABLE_XET": "1", "TMPDIR": str(work / "tmp"),
                        "HF_HUB_DISABLE_TELEMETRY": "1", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
                        "STZ_SCALE_CHECKPOINTS": str(checkpoints)}
    (work / "tmp").mkdir(exist_ok=True)
    port = free_loopback_port()
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{port}"
    me = [sys.executable, str(Path(__file__).resolve())]
    stz = stz_command()
    step = [*me, "--work", str(work), "--task", task, "--step"]
    zoo, top = str(work / "zoo"), str(work / "unpacked" / ("AG-News-Transformers" if task == "agnews" else
                                                              "MNIST-Transformers"))
    plan = [("write the release and its zip", [*step, "write"]),
            ("stz import-original (folder)", [stz, "import-original", top, zoo, "--config", CONFIG,
                                              "--no-progress"]),
            ("stz import-original (zip)", [stz, "import-original", str(work / "release.zip"),
                                           str(work / "zoo-zip"), "--config", CONFIG, "--no-progress"]),
            ("stz export-original (folder)", [stz, "export-original", zoo, "--config", CONFIG, "--out",
                                              str(work / "exported"), "--no-progress"]),
            ("stz export-original (zip)", [stz, "export-original", zoo, "--config", CONFIG, "--out",
                                           str(work / "exported-zip"), "--zip", "--no-progress"]),
            ("stz verify", [stz, "verify", zoo, "--config", CONFIG]),
            ("Zoo.open + split_weights().to_tensor()", [*step, "tensors"]),
            ("load_dataset: Arrow preparation", [*step, "load"]),
            ("load_dataset: cached", [*step, "load"]),
            ("with_format(torch) + DataLoader (train)", [*step, "loader"]),
            ("stz push (loopback Hub)", [stz, "push", zoo, REPO]),
            ("load_dataset from the Hub (fresh)", [*step, "hub-load"]),
            ("streaming the train split from the Hub", [*step, "stream"])]
    plan += [(f"stz bench --protocol {p}", [stz, "bench", zoo, "--config", CONFIG, "--protocol", p, *BENCH,
                                            "--models", *models, "--out", str(work / f"bench-{p}")])
             for p, models in benches]
    plan += [("stz score (full submission) + merge", [*step, "score"]),
             ("stz leaderboard (render)", [stz, "leaderboard", str(work / "leaderboard.json"), "--markdown",
                                           str(work / "leaderboard.md")]),
             ("stz info", [stz, "info", zoo, "--config", CONFIG]),
             ("Zoo.select (filtered, metadata only)", [*step, "select"]),
             ("stz card", [stz, "card", zoo])]
    if only:
        plan = [(label, command) for label, command in plan if label == "write the release and its zip"
                or any(label.startswith(prefix) for prefix in only)]
    server = subprocess.Popen([*me, "--serve", str(port)], env=env, stdout=subprocess.DEVNULL)
    try:
        for label, command in plan:
            measured = measure(command, env)
            measured.update(task=task, fraction=fraction, checkpoints=checkpoints, step=label)
            if label.startswith("stz bench") and measured["rc"] == 0:
                measured["epoch_seconds"] = _epoch_seconds(work / f"bench-{label.split()[-1]}")
                measured["models"] = dict(benches)[label.split()[-1]]
            with open(record, "a") as handle:
                handle.write(json.dumps(measured) + "\n")
            print(f"{task} {fraction:>6} {label:<44} {measured['seconds']:9.1f} s {measured['rss_gib']:7.2f} GiB"
                  f"  rc {measured['rc']}{'  ' + measured.get('error', '') if measured['rc'] else ''}", flush=True)
            if label == "stz import-original (zip)":
                shutil.rmtree(work / "zoo-zip", ignore_errors=True)
            if label.startswith("stz export-original"):
                shutil.rmtree(work / ("exported-zip" if "zip" in label else "exported"), ignore_errors=True)
    finally:
        server.terminate()
        server.wait()
        for entry in work.iterdir():
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()


def measure(command: list[str], env: dict[str, str]) -> dict[str, object]:
    """Run `command` under /usr/bin/time -v: its wall time, peak RSS and exit code (and stderr's tail if it
    failed)."""
    start = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-v", *command], env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
    result: dict[str, object] = {"seconds": round(seconds, 2), "rss_gib": int(rss.group(1)) / 2**20 if rss else
                                 float("nan"), "rc": done.returncode, "stdout_tail": done.stdout[-600:]}
    if done.returncode:
        own = done.stderr.split("\tCommand being timed")[0].strip().splitlines()
        result["error"] = own[-2] if len(own) > 1 else "".join(own)
        result["stderr_tail"] = "\n".join(own)[-2000:]
    return result


def _epoch_seconds(out: Path) -> dict[str, float]:
    """Training seconds per epoch of each neural model, validation included (the results JSON's fit time over the
    epochs asked for)."""
    results = json.loads(next(out.glob("*bench*.json")).read_text())
    epochs = results["request"]["epochs"]
    return {model: round(sum(times.values()) / epochs, 2) for model, times in results["fit_seconds"].items()
            if model in ("transformer_nfn", "mlp", "statnn")}


def serve(port: int) -> None:
    """The loopback Hub, until terminated."""
    from small_transformer_zoo.testing import HubServer

    with HubServer(port):
        while True:
            time.sleep(3600)


def step_write(work: Path, task: str) -> None:
    from small_transformer_zoo.testing.synthetic_release import write_synthetic_release

    release = write_synthetic_release(work / "unpacked", checkpoints=int(os.environ["STZ_SCALE_CHECKPOINTS"]),
                                      text=task == "agnews", learnable=True, keep_weights=False)
    with zipfile.ZipFile(work / "release.zip", "w", zipfile.ZIP_DEFLATED, compresslevel=1) as archive:
        for path in sorted(release.top.rglob("*")):
            archive.write(path, path.relative_to(release.top.parent).as_posix())
    print(f"{len(release.accuracies):,} checkpoints")


def step_tensors(work: Path, task: str) -> None:
    from small_transformer_zoo import Zoo

    zoo = Zoo.open(work / "zoo", CONFIG)
    for split in zoo.splits:
        tensor = zoo.split_weights(split).to_tensor()
        print(split, tuple(tensor.shape))
        del tensor


def step_load(work: Path, task: str) -> None:
    from small_transformer_zoo import load_dataset

    print({k: v.num_rows for k, v in load_dataset(work / "zoo", CONFIG, cache_dir=str(work / "arrow")).items()})


def step_loader(work: Path, task: str) -> None:
    import torch

    from small_transformer_zoo import load_dataset

    train = load_dataset(work / "zoo", CONFIG, split="train", cache_dir=str(work / "arrow")).with_format("torch")
    rows = sum(len(batch["params"]) for batch in torch.utils.data.DataLoader(train, batch_size=256))
    print(f"{rows:,} rows")


def step_hub_load(work: Path, task: str) -> None:
    from small_transformer_zoo import load_dataset

    print({k: v.num_rows for k, v in load_dataset(REPO, CONFIG, cache_dir=str(work / "arrow-hub")).items()})


def step_stream(work: Path, task: str) -> None:
    from small_transformer_zoo import load_dataset

    rows = sum(1 for _ in load_dataset(REPO, CONFIG, split="train", streaming=True))
    print(f"{rows:,} rows")


def step_score(work: Path, task: str) -> None:
    """Write a full submission for the test split (the true accuracy plus noise), then score it into a
    leaderboard file with `stz score`, in this process."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.csv as pacsv

    from small_transformer_zoo import Zoo
    from small_transformer_zoo.cli import main as stz

    test = Zoo.open(work / "zoo", CONFIG).metadata("test")
    accuracy = np.asarray(test.column("test_accuracy").to_numpy(zero_copy_only=False), dtype=float)
    noisy = np.clip(accuracy + np.random.default_rng(0).normal(0, 0.05, len(accuracy)), 0, 1)
    pacsv.write_csv(pa.table({"checkpoint_id": test.column("checkpoint_id"), "predicted_accuracy": noisy}),
                    work / "submission.csv")
    code = stz(["score", str(work / "submission.csv"), "--zoo", str(work / "zoo"), "--config", CONFIG,
                "--leaderboard", str(work / "leaderboard.json"), "--name", "noisy-truth"])
    sys.exit(code)


def step_select(work: Path, task: str) -> None:
    from small_transformer_zoo import Zoo

    zoo = Zoo.open(work / "zoo", CONFIG)
    picked = {split: len(zoo.select(split, min_accuracy=0.5, where={"optimizer": "adam"})) for split in zoo.splits}
    print(picked)


STEPS = {"write": step_write, "tensors": step_tensors, "load": step_load, "loader": step_loader,
         "hub-load": step_hub_load, "stream": step_stream, "score": step_score, "select": step_select}


def print_report(rows: list[dict]) -> None:
    """Each step's time and peak RSS at every size, per task, and its growth exponent."""
    for task in sorted({r["task"] for r in rows}):
        mine = [r for r in rows if r["task"] == task]
        sizes = sorted({r["checkpoints"] for r in mine})
        print(f"\n{task}: seconds / peak RSS GiB at " + ", ".join(f"{s:,}" for s in sizes) + " checkpoints")
        print(f"{'step':<44}" + "".join(f"{s:>18,}" for s in sizes) + "   growth")
        for step in dict.fromkeys(r["step"] for r in mine):
            cells, points = [], []
            for size in sizes:
                hit = [r for r in mine if r["step"] == step and r["checkpoints"] == size]
                if not hit:
                    cells.append(f"{'-':>18}")
                    continue
                r = hit[-1]
                cells.append(f"{r['seconds']:>9.1f} / {r['rss_gib']:5.2f}" if r["rc"] == 0 else f"{'failed':>18}")
                if r["rc"] == 0:
                    points.append((size, r["seconds"]))
            growth = (f"{math.log(points[-1][1] / points[0][1]) / math.log(points[-1][0] / points[0][0]):8.2f}"
                      if len(points) > 1 and points[0][1] > 0 else f"{'-':>8}")
            print(f"{step:<44}" + "".join(cells) + growth)
        for r in mine:
            if r.get("epoch_seconds"):
                print(f"  {r['step']} at {r['checkpoints']:,}: seconds per epoch {r['epoch_seconds']}")


def plot_report(rows: list[dict], path: Path) -> None:
    """Per task, each step's seconds and peak RSS against the checkpoints on log-log axes, with a dashed line of
    slope 1 through the median step's smallest size: a step steeper than it grows faster than linearly."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks = sorted({r["task"] for r in rows})
    figure, axes = plt.subplots(len(tasks), 2, figsize=(13, 5 * len(tasks)), squeeze=False)
    for (time_axis, memory_axis), task in zip(axes, tasks):
        mine = [r for r in rows if r["task"] == task and r["rc"] == 0]
        colours = plt.get_cmap("tab20").colors
        for number, step in enumerate(dict.fromkeys(r["step"] for r in mine)):
            points = sorted((r["checkpoints"], r["seconds"], r["rss_gib"]) for r in mine if r["step"] == step)
            sizes = [p[0] for p in points]
            style = dict(color=colours[number % len(colours)], marker="osD^v"[number % 5], label=step)
            time_axis.plot(sizes, [p[1] for p in points], **style)
            memory_axis.plot(sizes, [p[2] for p in points], **style)
        smallest, largest = min(r["checkpoints"] for r in mine), max(r["checkpoints"] for r in mine)
        middle = sorted(r["seconds"] for r in mine if r["checkpoints"] == smallest)
        middle_seconds = middle[len(middle) // 2]
        time_axis.plot([smallest, largest], [middle_seconds, middle_seconds * largest / smallest], "k--",
                       label="linear")
        for axis, label in ((time_axis, "seconds"), (memory_axis, "peak RSS (GiB)")):
            axis.set(xscale="log", yscale="log", xlabel="checkpoints", ylabel=label, title=f"{task}: {label}")
            axis.grid(True, which="both", alpha=0.3)
        memory_axis.axhline(16, color="red", linestyle=":", label="16 GiB")
        time_axis.legend(fontsize=7, loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
