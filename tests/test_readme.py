"""Every Python example in README.md runs, against a zoo written by the quickstart and the loopback Hub."""

import re
from pathlib import Path

import pytest

from small_transformer_zoo.cli import main
from small_transformer_zoo.hub import DEFAULT_REPO_ID
from tests.hub_server import HubServer

PROJECT = Path(__file__).resolve().parents[1]
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


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_readme_example_runs(index: int, readme_dir: Path, hub: HubServer, stz_home: Path,
                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The examples name the quickstart's `mnist-mini` zoo; here they run on the `tiny` one it builds in seconds."""
    monkeypatch.chdir(readme_dir)
    if not (readme_dir / "stz-out" / "mnist-tiny" / "zoo.json").exists():
        assert main(["quickstart", "--out", "stz-out", "--preset", "tiny", "--epochs", "2"]) == 0
    else:
        from small_transformer_zoo.registry import register_local_zoo
        register_local_zoo("mnist-tiny", readme_dir / "stz-out")
    hub.add_dataset(DEFAULT_REPO_ID, readme_dir / "stz-out")
    code = EXAMPLES[index].replace('"mnist-mini"', '"mnist-tiny"')
    exec(compile(code, f"README.md example {index + 1}", "exec"), {"__name__": "__readme__"})
