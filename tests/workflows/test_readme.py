"""Every Python example in README.md runs, against a zoo written by the quickstart and the loopback Hub."""

import re
from pathlib import Path

import pytest

from small_transformer_zoo.cli import main
from small_transformer_zoo.store.local_index import DEFAULT_REPO_ID
from small_transformer_zoo.testing import HubServer
from tests.helpers import PROJECT

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
    assert commands[1] in (PROJECT / ".ci" / "run").read_text(), ".ci/run must run the README's test command"


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


def _runnable_here(line: str) -> str | None:
    """Why a README command cannot run in a test (None: it can): full data sets, other machines, the real Hub."""
    if " DIR" in line or "hf://" in line or "vectors.txt" in line:
        return "needs a full data set or the real Hub"
    if "--ray" in line or "--device cuda" in line or "$SLURM" in line or "shards/*" in line:
        return "needs a cluster or a GPU"
    from builders.data import FASHION_MNIST_DIR

    if "fashion_mnist" in line and not FASHION_MNIST_DIR.is_dir():
        return "needs dataset-fashion-mnist"
    if line.split()[1] in ("build", "info", "public-copy", "push"):
        return None
    return "trains models, or needs a submission or a leaderboard first (parsed above; run in their own tests)"


@pytest.mark.slow
def test_readme_shell_commands_run(readme_dir: Path, hub: HubServer, stz_home: Path,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Every README command that builds, inspects, copies or publishes a zoo runs, in README order, as written:
    a build as its `--dry-run` (the plan, the data and the estimate), `zoos` and `ZOO` as the README's zoo folder,
    the Hub as the loopback server."""
    import shlex

    _readme_zoo(readme_dir, hub, monkeypatch)
    ran, skipped = [], {}
    for line in dict.fromkeys(_command_lines()):
        why = _runnable_here(line)
        if why:
            skipped[line] = why
            continue
        argv = shlex.split(line)[1:]
        if argv[0] == "build":
            argv = [a if a != "zoos" else "built" for a in argv] + ([] if "--dry-run" in argv else ["--dry-run"])
        else:
            argv = [{"zoos": "stz-out", "ZOO": "stz-out"}.get(a, a) for a in argv]
        assert main(argv) == 0, line
        ran.append(argv[0])
    assert {"build", "info", "public-copy", "push"} <= set(ran), (ran, skipped)
    assert not (readme_dir / "built").exists(), "a dry run writes nothing"


@pytest.mark.parametrize("preset", ["mini", "families", "wide", "medium"])
def test_the_readme_quotes_the_dry_run_estimate(preset: str, tmp_path: Path) -> None:
    """One estimate everywhere: the README's build time for a preset is what `--dry-run` prints on 2 cores."""
    from builders.build import BuildRequest, run_build
    from builders.plan import duration_text

    result = run_build(BuildRequest.of("mnist", preset, tmp_path, workers=2), dry_run=True, log=lambda _: None)
    row = next(line for line in README.splitlines() if line.startswith(f"| `{preset}` |"))
    assert f"{duration_text(result['cost']['estimated_hours'])} on 2 cores" in row
