import json
from pathlib import Path

import pytest

from small_transformer_zoo.cli import main


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


def test_errors_are_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(tmp_path)]) == 2
    assert "holds no zoo config" in capsys.readouterr().err
