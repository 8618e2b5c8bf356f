"""The short name `small-transformer-zoo` on a machine with several zoos: it never silently reads a different zoo
than the user means, a typo is answered without the network, and a damaged registry is an error, never a reset."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from small_transformer_zoo import ZooFormatError, load_dataset
from small_transformer_zoo.cli import main
from small_transformer_zoo.store.local_index import find_local_zoo, register_local_zoo, registry_path
from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo


@pytest.fixture
def two_zoos(tmp_path: Path, stz_home: Path) -> tuple[Path, Path]:
    """Two different zoos of config `syn`, built (and so registered) in two places, the second one last."""
    first, second = tmp_path / "first", tmp_path / "second"
    write_synthetic_zoo(first, "syn", runs=8, seed=1)
    write_synthetic_zoo(second, "syn", runs=8, seed=2)
    return first, second


def test_two_different_zoos_under_one_name_are_an_error_that_lists_both(two_zoos, capsys) -> None:
    first, second = two_zoos
    with pytest.raises(ZooFormatError) as caught:
        load_dataset("small-transformer-zoo", "syn")
    message = str(caught.value)
    assert str(first / "syn") in message and str(second / "syn") in message
    assert "stz register ROOT --config syn" in message and "by its path" in message
    assert main(["info", "small-transformer-zoo", "--config", "syn"]) != 0
    assert str(first / "syn") in capsys.readouterr().err


def test_stz_register_chooses_and_info_says_which_zoo_the_name_means(two_zoos, capsys) -> None:
    first, second = two_zoos
    assert main(["register", str(first)]) == 0
    assert f"now reads {first.resolve() / 'syn'} (instead of {second.resolve() / 'syn'})" in capsys.readouterr().out
    assert find_local_zoo("syn") == first.resolve()
    assert main(["info", "small-transformer-zoo", "--config", "syn"]) == 0
    out = capsys.readouterr().out
    assert f"resolves to the zoo registered on this machine at {first.resolve() / 'syn'}" in out
    assert len(load_dataset("small-transformer-zoo", "syn", split="train")) == \
        len(load_dataset(first, "syn", split="train"))


def test_copies_of_one_zoo_are_one_zoo(tmp_path: Path, stz_home: Path) -> None:
    write_synthetic_zoo(tmp_path / "a", "syn", runs=6)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    register_local_zoo("syn", tmp_path / "b")
    assert find_local_zoo("syn") == (tmp_path / "b").resolve(), "the latest of identical zoos"
    shutil.rmtree(tmp_path / "b")
    assert find_local_zoo("syn") == (tmp_path / "a").resolve(), "a zoo that is gone no longer counts"


def test_a_typo_of_a_registered_config_is_answered_at_once_without_the_hub(tmp_path: Path, stz_home: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    write_synthetic_zoo(tmp_path, "mnist-mini", runs=4)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    started = time.perf_counter()
    with pytest.raises(ZooFormatError, match=r"did you mean 'mnist-mini'\? Config 'mnist-mnii' is not registered"):
        load_dataset("small-transformer-zoo", "mnist-mnii")
    assert time.perf_counter() - started < 5
    script = ("import sys; from small_transformer_zoo import load_dataset\n"
              "try:\n    load_dataset('small-transformer-zoo', 'mnist-mnii')\n"
              "except Exception as e:\n    print(str(e))\n")
    env = os.environ | {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.stdout.startswith("small-transformer-zoo: did you mean 'mnist-mini'?"), done.stdout + done.stderr


@pytest.mark.parametrize("content", [b'{"syn": ["/x"', b"\x00\x00\x00", b"not json", b'["a", "b"]', b'{"syn": 3}'],
                         ids=["truncated", "nul-bytes", "garbage", "a-list", "a-number"])
def test_a_damaged_registry_is_an_error_naming_it_and_is_never_reset(tmp_path: Path, stz_home: Path,
                                                                     content: bytes) -> None:
    write_synthetic_zoo(tmp_path / "zoo", "syn", runs=4, register=False)
    registry_path().parent.mkdir(parents=True, exist_ok=True)
    registry_path().write_bytes(content)
    with pytest.raises(ZooFormatError, match=r"registry\.json.*the registry of local zoos is damaged"):
        register_local_zoo("syn", tmp_path / "zoo")
    assert main(["register", str(tmp_path / "zoo")]) == 1
    assert registry_path().read_bytes() == content, "nothing written over it"
    with pytest.raises(ZooFormatError, match="registry"):
        load_dataset("small-transformer-zoo", "syn")


def test_a_registry_that_is_not_a_regular_file_does_not_hang(stz_home: Path) -> None:
    registry_path().parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(registry_path())
    started = time.perf_counter()
    with pytest.raises(ZooFormatError, match="is not a regular file"):
        find_local_zoo("syn")
    assert time.perf_counter() - started < 5


def test_a_registry_of_one_root_per_config_still_reads(tmp_path: Path, stz_home: Path) -> None:
    """Registries written before several roots were kept map a config to one root."""
    write_synthetic_zoo(tmp_path, "syn", runs=4, register=False)
    registry_path().parent.mkdir(parents=True, exist_ok=True)
    registry_path().write_text(f'{{"syn": "{tmp_path.resolve()}"}}')
    assert find_local_zoo("syn") == tmp_path.resolve()
