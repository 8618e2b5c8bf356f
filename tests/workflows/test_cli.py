import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from small_transformer_zoo.cli import main
from tests.helpers import HANG_TIMEOUT


def test_info_prints_counts_and_accuracy(synthetic_root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(synthetic_root)]) == 0
    out = capsys.readouterr().out
    assert "config syn" in out and "18,506" in out and "train" in out and "test accuracy" in out
    assert main(["info", str(synthetic_root), "--config", "syn", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    manifest = json.loads((synthetic_root / "syn" / "zoo.json").read_text())
    assert sum(s["checkpoints"] for s in summary["splits"].values()) == manifest["counts"]["checkpoints"]


def test_verify_passes_then_fails_on_damage(zoo_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["verify", str(zoo_copy)]) == 0
    assert "OK" in capsys.readouterr().out
    shard = next((zoo_copy / "syn" / "weights").glob("validation-*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-1] + b"\x7f")
    assert main(["verify", str(zoo_copy)]) == 1
    assert f"FAIL {shard}: sha256" in capsys.readouterr().out


def test_errors_are_one_line_and_exit_1_for_data(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "holds no zoo config" in err and err.count("\n") == 1


def test_plain_stz_prints_help_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 0
    assert "usage: stz" in capsys.readouterr().out
    assert main(["--version"]) == 0 and capsys.readouterr().out.startswith("stz ")


def _bad_calls(tmp_path: Path, zoo: Path) -> list[tuple[list[str], int]]:
    missing, out = str(tmp_path / "missing"), str(tmp_path / "out")
    return [
        (["info", missing], 1),
        (["verify", missing], 1),
        (["card", missing], 1),
        (["push", missing, "org/zoo"], 1),
        (["import-original", missing, out, "--config", "c"], 1),
        (["import-original", missing, out], 2),
        (["build", "--task", "cifar", "--out", out], 2),
        (["build", "--task", "mnist", "--preset", "tiny", "--out", out, "--device", "tpu"], 2),
        (["build", "--task", "mnist", "--preset", "tiny", "--out", out, "--data-dir", missing], 1),
        (["merge", out, missing, "--task", "mnist", "--preset", "tiny"], 1),
        (["bench", "--zoo", missing, "--config", "syn"], 1),
        (["bench", "--zoo", str(zoo), "--config", "syn", "--models", "oracle"], 2),
        (["score", missing, "--zoo", str(zoo), "--config", "syn"], 1),
        (["leaderboard", str(tmp_path / "missing.json")], 1),
        (["leaderboard", "--hub", "board/missing"], 1),
        (["submit", missing, "--leaderboard", "board/missing", "--zoo", str(zoo), "--config", "syn", "--name", "a"],
         1),
        (["submit", missing, "--zoo", str(zoo), "--config", "syn", "--name", "a"], 2),
        (["review", "board/missing", "--zoo", str(zoo)], 1),
        (["public-copy", missing, "--out", out], 1),
        (["public-copy", str(zoo), "--out", out, "--withhold", "holdout"], 1),
        (["quickstart", "--preset", "huge"], 2),
        (["quickstart", "--out", out, "--device", "tpu"], 2),
        (["nonsense"], 2),
    ]


def test_every_subcommand_fails_cleanly_on_bad_input(tmp_path: Path, synthetic_root: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Each subcommand with a bad argument or missing input: exit 1 (data) or 2 (usage), one line, no traceback."""
    for argv, code in _bad_calls(tmp_path, synthetic_root):
        try:
            got = main(argv)
        except SystemExit as exc:  # argparse's own usage errors
            got = exc.code
        err = capsys.readouterr().err
        assert got == code, f"stz {' '.join(argv)}: exit {got}, expected {code}; stderr: {err}"
        assert "Traceback" not in err and err.strip(), f"stz {' '.join(argv)}: {err}"
        assert err.strip().splitlines()[-1].startswith(("stz ", "usage:")) or "error:" in err


@pytest.mark.parametrize("argv,message", [
    (["push", "{zoo}", "org/zoo"], "push to dataset org/zoo failed"),
    (["leaderboard", "--hub", "org/board"], "reading results.json of dataset org/board failed"),
    (["review", "org/board", "--zoo", "{zoo}"], "listing pull requests of dataset org/board failed"),
])
@pytest.mark.slow
def test_hub_commands_without_a_network_are_one_line(synthetic_root: Path, argv: list[str], message: str) -> None:
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_TOKEN": "x"}
    argv = [a.replace("{zoo}", str(synthetic_root)) for a in argv]
    done = subprocess.run([sys.executable, "-m", "small_transformer_zoo.cli", *argv], capture_output=True, text=True,
                          env=env, timeout=HANG_TIMEOUT)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1 and message in done.stderr


def test_every_flag_has_help_and_shows_its_default() -> None:
    import argparse

    from small_transformer_zoo.cli import build_parser

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    for name, parser in commands.items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
                continue
            where = f"stz {name} {'/'.join(action.option_strings) or action.dest}"
            assert action.help, f"{where} has no help text"
            if action.default not in (None, False) and action.option_strings:
                assert "default" in action.help, f"{where}: help does not show the default {action.default!r}"


def test_a_hub_repo_id_is_a_zoo_root_everywhere(hub, synthetic_root: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from nfn_baselines.bench.submission import write_submission
    from small_transformer_zoo import Zoo
    from small_transformer_zoo.hub.push import push_zoo

    push_zoo(synthetic_root, "cli/zoo")
    assert main(["info", "cli/zoo"]) == 0
    assert "config syn" in capsys.readouterr().out
    assert main(["verify", "cli/zoo", "--config", "syn"]) == 0
    assert "OK " in capsys.readouterr().out
    meta = Zoo.open(synthetic_root, "syn").metadata("test")
    ids = meta.column("checkpoint_id").to_pylist()
    submission = write_submission(tmp_path / "p.csv", ids, meta.column("test_accuracy").to_numpy())
    assert main(["score", str(submission), "--zoo", "cli/zoo"]) == 0  # --config left out: the root has one
    out = capsys.readouterr().out
    assert "20 checkpoints of 5 runs of" in out and "tau        too few runs (5; a figure needs 10)" in out
    assert main(["info", "cli/missing"]) == 1
    assert "reading it as a Hub dataset repo failed (RepositoryNotFoundError" in capsys.readouterr().err
    assert main(["info", str(tmp_path / "nowhere" / "zoo" / "x")]) == 1
    assert "no such folder" in capsys.readouterr().err


def test_bench_takes_the_zoo_like_every_command_and_writes_beside_it(zoo_copy: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(zoo_copy), "--seeds", "1", "--epochs", "1", "--models", "mlp", "--no-floors"]) == 0
    assert (zoo_copy / "bench" / "syn-bench.json").is_file()
    assert "| mlp |" in capsys.readouterr().out
    assert main(["bench", str(zoo_copy), "--zoo", str(zoo_copy), "--models", "mlp"]) == 2
    assert "name the zoo once" in capsys.readouterr().err


def test_bench_thresholds_alone_trains_the_unfiltered_zoo_only(zoo_copy: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    common = ["bench", str(zoo_copy), "--protocol", "paper", "--epoch", "10", "--seeds", "1", "--models", "l2_norm",
              "--no-floors"]
    assert main([*common, "--thresholds", "0.2", "--out", str(zoo_copy / "with")]) == 0
    assert "tau (acc >= 0.2)" in capsys.readouterr().out
    assert main([*common, "--thresholds", "--out", str(zoo_copy / "without")]) == 0
    table = capsys.readouterr().out
    assert "| l2_norm |" in table and "tau (all)" in table and "acc >=" not in table
    results = json.loads(next((zoo_copy / "without").glob("*.json")).read_text())
    assert results["request"]["thresholds"] == []
    assert list(results["fit_seconds"]) == ["l2_norm"] and list(results["fit_seconds"]["l2_norm"]) == ["all"]
    assert results["fit_seconds"]["l2_norm"]["all"] == pytest.approx(results["training_seconds"])
