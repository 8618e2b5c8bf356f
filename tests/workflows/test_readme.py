"""Every Python example and every `stz` command line of README.md runs, against a zoo written by the quickstart
and the loopback Hub (command lines cut down where they are expensive)."""

import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from nfn_baselines.bench.submission import write_submission
from small_transformer_zoo import Zoo
from small_transformer_zoo.cli import main
from small_transformer_zoo.store.local_index import DEFAULT_REPO_ID
from small_transformer_zoo.testing import HubServer
from tests.helpers import PROJECT, hub_dataset, shared_data

README = (PROJECT / "README.md").read_text()
EXAMPLES = re.findall(r"```python\n(.*?)```", README, flags=re.S)


@pytest.fixture(scope="module")
def readme_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("readme")
    return folder


def test_readme_has_examples_and_the_two_quickstart_commands() -> None:
    assert len(EXAMPLES) >= 4
    commands = re.findall(r"```bash\n(.*?)\n```", README.split("## Quickstart")[1].split("## ")[0], flags=re.S)
    assert len(commands) == 2
    assert commands[0].endswith("stz quickstart") and commands[1].endswith("python -m pytest")
    ci = (PROJECT / ".ci" / "run").read_text()
    steps = commands[1].split(" && ")
    setup, tests = " && ".join(steps[:-1]), steps[-1]
    assert setup in ci, ".ci/run must set up as the README's test command does"
    assert re.search(rf"^[^#\n]*{re.escape(tests)}$", ci[ci.index(setup):], flags=re.M), \
        ".ci/run must then run the README's test command"


@pytest.mark.slow
@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_readme_example_runs(index: int, readme_dir: Path, hub: HubServer, stz_home: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The examples name the quickstart's `mnist-mini` zoo; here they run on the `tiny` one it builds in seconds."""
    _readme_zoo(readme_dir, hub, monkeypatch)
    code = EXAMPLES[index].replace('"mnist-mini"', '"mnist-tiny"')
    exec(compile(code, f"README.md example {index + 1}", "exec"), {"__name__": "__readme__"})


@pytest.mark.parametrize("start", ["spawn", "forkserver"])
def test_the_fast_path_example_runs_in_spawned_workers(start: str, readme_dir: Path, hub: HubServer,
                                                       stz_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast-path example's DataLoader workers as macOS and Windows start them: the dataset reaches them
    pickled, by path and file version, and they map the shards again."""
    _readme_zoo(readme_dir, hub, monkeypatch)
    (code,) = [e for e in EXAMPLES if "WeightSpaceDataset(weights)" in e]
    assert "num_workers=2," in code
    code = code.replace('"mnist-mini"', '"mnist-tiny"').replace(
        "num_workers=2,", f"num_workers=2, multiprocessing_context={start!r},")
    exec(compile(code, f"README.md fast path under {start}", "exec"), {"__name__": "__readme__"})


def _readme_zoo(readme_dir: Path, hub: HubServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's zoo (as `tiny`), built once, registered and served by the loopback Hub; the cwd is its folder."""
    monkeypatch.chdir(readme_dir)
    if not (readme_dir / "stz-out" / "mnist-tiny" / "zoo.json").exists():
        assert main(["quickstart", "--out", "stz-out", "--preset", "tiny", "--epochs", "2"]) == 0
    else:
        from small_transformer_zoo.store.local_index import register_local_zoo
        register_local_zoo("mnist-tiny", readme_dir / "stz-out")
    hub.add_dataset(DEFAULT_REPO_ID, readme_dir / "stz-out")


def _command_lines() -> list[str]:
    """Every `stz ...` command in the README's shell examples and inline code (table rows are syntax summaries)."""
    text = README.replace("\\\n", " ")
    prose = "\n".join(line for line in text.splitlines() if not line.startswith("|")).replace("\n", " ")
    lines = [span for span in re.findall(r"`(stz [^`]+)`", prose) if len(span.split()) > 2]
    for block in re.findall(r"(?:```bash\n(.*?)```)|((?:^    .*\n)+)", text, flags=re.S | re.M):
        for line in "".join(block).splitlines():
            line = line.strip()
            for part in line.split("&&"):
                part = part.strip()
                if part.startswith("stz ") or part.startswith("stz\t"):
                    lines.append(part.split("  #")[0].strip())
    return lines


def test_every_readme_command_line_is_accepted_by_stz() -> None:
    """The shell examples name real subcommands and options (parsed by `stz`'s own parser, not run)."""
    import shlex

    from small_transformer_zoo.cli import build_parser

    commands = _command_lines()
    assert len(commands) >= 12
    used = set()
    for line in commands:
        argv = shlex.split(line.replace("$SLURM_ARRAY_TASK_ID", "0").replace("$JOB_COMPLETION_INDEX", "0"))[1:]
        args = build_parser().parse_args(argv)
        used.add(args.command)
    assert {"quickstart", "build", "merge", "bench", "score", "leaderboard", "push"} <= used


# The README's zoo, cut down: `mini` as the README has it, on fewer training and validation images, so that every README
# command line that trains or benchmarks runs here in seconds (the command lines themselves are unchanged); the
# paper's fixed recipe for Transformer-NFN, which no flag shortens, on 2 epochs of its 50.
CUT_MINI = {"max_train_samples": 256, "max_validation_samples": 200}
CUT_PAPER_RECIPE = {"epochs": 2, "warmup_epochs": 1}
GPU_ONLY = "needs a GPU"


def _cut_down(line: str, here: Path) -> list[str] | str:
    """The argv a README command line runs with here, or why it cannot run on this machine: placeholders filled
    (`ZOO`, `ROOT`, `zoos`: the README's zoo folder; `DIR`: the real test sets, carved on purpose), a build as its
    dry run (the merge's shards and a quickstart build for real, cut down), a benchmark on 1 seed of 1 epoch of two
    models, a config the README's zoo does not hold as its `mnist-mini`."""
    import shlex

    argv = shlex.split(line.replace("$SLURM_ARRAY_TASK_ID", "0").replace("$JOB_COMPLETION_INDEX", "0"))[1:]
    if "--device" in argv and argv[argv.index("--device") + 1] == "cuda":
        return GPU_ONLY
    names = {"ZOO": "stz-out", "ROOT": "stz-out", "NAME": "mnist-mini", "mnist-medium": "mnist-mini"}
    argv = [names.get(a, a) for a in argv]
    command = argv[0]
    if command == "build":
        from builders.data import FASHION_MNIST_DIR

        if "fashion_mnist" in argv and not FASHION_MNIST_DIR.is_dir():
            return "needs dataset-fashion-mnist (apt-get install dataset-fashion-mnist)"
        if "DIR" in argv:
            task = argv[argv.index("--task") + 1]
            argv[argv.index("DIR")] = str(shared_data("ag_news" if task == "agnews" else "mnist"))
            argv.append("--carve-from-test")
        return [a if a != "zoos" else "built" for a in argv] + ([] if "--dry-run" in argv else ["--dry-run"])
    if command == "merge":  # two real shards of `tiny`, joined
        for index in range(2):
            assert run_as_a_command(["build", "--task", "mnist", "--preset", "tiny", "--out", f"shards/{index}",
                                     "--num-shards", "2", "--shard-index", str(index), "--no-progress"], here) == 0
        return ["merge", "merged", *sorted(str(p) for p in (here / "shards").iterdir()), "--task", "mnist", "--preset",
                "tiny"]
    argv = [a if a != "zoos" else "stz-out" for a in argv]
    if command == "bench":
        argv += ["--seeds", "1", "--epochs", "1"] + ([] if "--models" in argv else ["--models", "statnn",
                                                                                   "transformer_nfn"])
    if command == "quickstart":
        argv += ["--epochs", "1"]
    for needed, made in (("predictions.csv", "mnist-mini-bench-statnn.csv"),
                         ("mnist-mini-bench-paper-statnn.csv", "mnist-mini-bench-paper-statnn.csv")):
        if needed in argv and not (here / needed).exists():
            shutil.copy(here / "stz-out" / "bench" / "submissions" / made, here / needed)
    if "mine.csv" in argv and not (here / "mine.csv").exists():
        zoo = Zoo.open(here / "stz-out", "mnist-mini")
        chosen = zoo.metadata("test").take(zoo.select("test", where={"optimizer": "adam"}))
        write_submission(here / "mine.csv", chosen.column("checkpoint_id").to_pylist(),
                         np.full(chosen.num_rows, 0.5) + np.linspace(0, 0.1, chosen.num_rows))
    return argv


def _readme_hub(here: Path, hub: HubServer) -> None:
    """What the README's commands read from the Hub, on the loopback server: the MNIST and AG News data sets (a
    few hundred real rows each) and the authors' release (a synthetic one in its layout, zipped)."""
    import datasets
    from PIL import Image

    from builders.data import load_idx_folder, read_ag_news_csv
    from small_transformer_zoo.testing.synthetic_release import write_synthetic_release

    digits = load_idx_folder(shared_data("mnist"), "mnist", carve_from_test=True)
    pixels = np.clip(np.rint((digits.train_x[:, 0] * 0.5 + 0.5) * 255), 0, 255).astype(np.uint8)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)})
    hub.add_dataset("ylecun/mnist", hub_dataset(here / "hub-mnist", {
        "train": {"image": [Image.fromarray(p) for p in pixels[:600]], "label": digits.train_y[:600].tolist()},
        "test": {"image": [Image.fromarray(p) for p in pixels[600:800]], "label": digits.train_y[600:800].tolist()}},
        features))
    texts, labels = read_ag_news_csv(shared_data("ag_news") / "test.csv")
    hub.add_dataset("fancyzhx/ag_news", hub_dataset(here / "hub-ag", {
        "train": {"text": texts[:1200], "label": labels[:1200].tolist()},
        "test": {"text": texts[1200:1600], "label": labels[1200:1600].tolist()}}))
    words = sorted({w for text in texts[:1200] for w in text.lower().split()})[:400]
    rng = np.random.default_rng(0)
    (here / "vectors.txt").write_text("".join(f"{w} {' '.join(f'{v:.4f}' for v in rng.normal(size=40))}\n"
                                              for w in words))
    release = write_synthetic_release(here / "release", runs=2)
    folder = here / "hub-release"
    folder.mkdir()
    with zipfile.ZipFile(folder / "MNIST-Transformers.zip", "w") as archive:
        for path in sorted(release.top.rglob("*")):
            archive.write(path, path.relative_to(release.top.parent).as_posix())
    hub.add_dataset("anonymized-acamedia/Small-Transformer-Zoo", folder)


def run_every_line(here: Path) -> dict[str, list[str] | dict[str, str]]:
    """Run every README command line in `here`, cut down (`_cut_down`), each in a process of its own: the lines
    run, and those that cannot run here with the reason."""
    ran, not_here = [], {}
    lines = list(dict.fromkeys(_command_lines()))
    for line in sorted(lines, key=lambda line: shlex_first(line) != "quickstart"):  # the README's zoo first
        argv = _cut_down(line, here)
        if isinstance(argv, str):
            not_here[line] = argv
            continue
        assert run_as_a_command(argv, here) == 0, f"README: {line}\n ran as: stz {' '.join(argv)}"
        ran.append(line)
    return {"ran": ran, "not_here": not_here}


def run_as_a_command(argv: list[str], here: Path) -> int:
    """`stz argv` in a fresh interpreter in `here`, as a shell runs a README line: what the line imports, caches or
    leaves on the heap ends with it, so its peak memory is its own (the largest, a `stz bench` line,
    about 1.3 GiB), never added to the suite's. `mini` is cut down there (`stz_cut_down`)."""
    script = "import json, sys; from tests.workflows.test_readme import stz_cut_down; " \
             "sys.exit(stz_cut_down(json.loads(sys.argv[1])))"
    return subprocess.run([sys.executable, "-c", script, json.dumps(argv)], cwd=here,
                          env={**os.environ, "PYTHONPATH": str(PROJECT)}).returncode


def stz_cut_down(argv: list[str]) -> int:
    """`stz argv` with the `mini` preset cut down to `CUT_MINI` and the paper's recipe to `CUT_PAPER_RECIPE`."""
    from builders.grid import PRESETS
    from nfn_baselines.models.predictors import PREDICTORS

    PRESETS["mini"] = replace(PRESETS["mini"], **CUT_MINI)
    paper = PREDICTORS["transformer_nfn_paper"]
    PREDICTORS[paper.name] = replace(paper, training={**paper.training, **CUT_PAPER_RECIPE})
    return main(argv)


@pytest.mark.slow
def test_every_readme_command_line_runs(tmp_path: Path, hub: HubServer, stz_home: Path) -> None:
    """Every `stz` command line of the README runs, in README order within each kind, cut down where it is
    expensive (`_cut_down`); only the GPU lines do not run here, and they are named. Each line runs in a process of
    its own (`run_as_a_command`), against this suite's loopback Hub and STZ_HOME."""
    _readme_hub(tmp_path, hub)
    result = run_every_line(tmp_path)
    ran, not_here = result["ran"], result["not_here"]
    assert set(not_here.values()) <= {GPU_ONLY, "needs dataset-fashion-mnist (apt-get install dataset-fashion-mnist)"}
    assert len([v for v in not_here.values() if v == GPU_ONLY]) == 2, not_here
    kinds = {shlex_first(line) for line in ran}
    assert {"quickstart", "build", "merge", "bench", "score", "leaderboard", "submit", "review", "push", "register",
            "info", "public-copy", "import-original", "export-original"} <= kinds
    assert not (tmp_path / "built").exists(), "builds ran as dry runs"


def shlex_first(line: str) -> str:
    return line.split()[1]


@pytest.mark.parametrize("preset", ["mini", "families", "wide", "trained", "medium"])
def test_the_readme_quotes_the_dry_run_estimate(preset: str, tmp_path: Path) -> None:
    """One estimate everywhere: the README's build time for a preset is what `--dry-run` prints on 2 cores."""
    from builders.build import BuildRequest, run_build
    from builders.plan import duration_text

    result = run_build(BuildRequest.of("mnist", preset, tmp_path, workers=2), dry_run=True, log=lambda _: None)
    row = next(line for line in README.splitlines() if line.startswith(f"| `{preset}` |"))
    assert f"{duration_text(result['cost']['estimated_hours'])} on 2 cores" in row
