"""A stopped `stz bench` resumes where it stopped: the fits it finished are read back, not trained again, and the
results equal those of a run that was never stopped. A damaged record is trained again; another command or
another zoo never reads this one's fits."""

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from nfn_baselines.bench.runs import BenchRequest, bench_store, run_bench
from small_transformer_zoo import Zoo, ZooWriter, mnist_spec
from small_transformer_zoo.cli import main

SPEC = mnist_spec()
REQUEST = dict(models=["statnn", "lightgbm", "l2_norm"], seeds=2, epochs=2, protocol="paper", epoch=2,
               thresholds=(0.5,), tune=True, resamples=100)
FITS = 3 * 2  # three models on two conditions: all checkpoints and acc >= 0.5


class Stopped(Exception):
    """Stands for whatever ends a run early: a closed laptop, a job's time limit, Ctrl-C."""


def _stop_after(count: int, zoo: Zoo, request: BenchRequest, out: Path) -> None:
    """Run the benchmark and stop it once `count` (model, condition)s are done."""
    done: list[tuple[str, str]] = []

    def on_done(model: str, condition: str, _: int) -> None:
        done.append((model, condition))
        if len(done) == count:
            raise Stopped
    with pytest.raises(Stopped):
        run_bench(zoo, request, out, on_done=on_done)


@pytest.fixture(scope="module")
def zoo_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Accuracy follows one shift added to the last biases, so every model has something to learn."""
    root = tmp_path_factory.mktemp("resume")
    rng = np.random.default_rng(1)
    with ZooWriter(root, "resume", SPEC, register=False) as writer:
        for run in range(120):
            shift = rng.uniform(-1, 1)
            for epoch in (1, 2):
                params = rng.normal(0, 0.2, SPEC.n_params).astype(np.float32)
                params[-10:] += shift * epoch
                accuracy = float(1 / (1 + np.exp(-3 * shift * epoch / 2)))
                writer.add(params, {"run_id": f"r{run}", "epoch": epoch, "test_accuracy": accuracy,
                                    "optimizer": "adam", "learning_rate": 1e-3})
    return root


def _tables(out: Path) -> tuple[dict, dict]:
    saved = json.loads((out / "resume-bench-paper-tuned.json").read_text())
    return saved["models"], saved["untuned"]["models"]


@pytest.fixture(scope="module")
def unstopped(zoo_root: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("unstopped")
    outcome = run_bench(Zoo.open(zoo_root, "resume"), BenchRequest(**REQUEST), out)
    assert outcome.resumed == 0 and outcome.training_seconds > 0
    return out


@pytest.mark.slow
def test_a_stopped_run_resumes_and_gives_the_results_of_an_unstopped_one(zoo_root: Path, unstopped: Path,
                                                                         tmp_path: Path) -> None:
    zoo, request = Zoo.open(zoo_root, "resume"), BenchRequest(**REQUEST)
    _stop_after(4, zoo, request, tmp_path)
    store = bench_store(zoo, request, tmp_path)
    assert len(store) == 4 and not (tmp_path / "resume-bench-paper-tuned.json").exists()

    trained: list[tuple[str, str]] = []
    outcome = run_bench(zoo, request, tmp_path, on_done=lambda m, c, _: trained.append((m, c)))
    assert outcome.resumed == 4 and len(trained) == FITS
    assert not store.folder.exists(), "a finished run leaves no resume records behind"
    assert _tables(tmp_path) == _tables(unstopped), "resumed fits score exactly as trained ones"
    saved = json.loads((tmp_path / "resume-bench-paper-tuned.json").read_text())
    assert saved["resumed_fits"] == 4 and saved["training_seconds"] >= saved["seconds"] - 60


def test_a_damaged_record_is_trained_again_with_a_warning_naming_it(zoo_root: Path, unstopped: Path,
                                                                    tmp_path: Path) -> None:
    zoo, request = Zoo.open(zoo_root, "resume"), BenchRequest(**REQUEST)
    _stop_after(2, zoo, request, tmp_path)
    records = sorted(bench_store(zoo, request, tmp_path).folder.glob("*.npz"))
    assert len(records) == 2
    records[0].write_bytes(records[0].read_bytes()[:100])
    with pytest.warns(UserWarning, match=f"{records[0].name}.*training them again"):
        outcome = run_bench(zoo, request, tmp_path)
    assert outcome.resumed == 1
    assert _tables(tmp_path) == _tables(unstopped)


@pytest.mark.slow
def test_another_command_or_fresh_trains_from_scratch(zoo_root: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    zoo, request = Zoo.open(zoo_root, "resume"), BenchRequest(**REQUEST)
    _stop_after(3, zoo, request, tmp_path)
    other = BenchRequest(**{**REQUEST, "seeds": 3})
    assert bench_store(zoo, other, tmp_path).folder != bench_store(zoo, request, tmp_path).folder
    scoring_only = BenchRequest(**{**REQUEST, "resamples": 300, "jobs": 2})
    assert bench_store(zoo, scoring_only, tmp_path).folder == bench_store(zoo, request, tmp_path).folder, \
        "what only changes the scoring does not change the fits"
    argv = ["bench", str(zoo_root), "--models", *REQUEST["models"], "--seeds", "2", "--epochs", "2", "--protocol",
            "paper", "--epoch", "2", "--thresholds", "0.5", "--tune", "--resamples", "100", "--out", str(tmp_path),
            "--device", "cpu", "--jobs", "1", "--no-floors"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(argv) == 0
    captured = capsys.readouterr()
    assert "resuming: 3 of 6 fits already done" in captured.err and "3 fits resumed" in captured.out
    _stop_after(3, zoo, request, tmp_path)
    assert main([*argv, "--fresh"]) == 0
    captured = capsys.readouterr()
    assert "resuming" not in captured.err and "fits resumed" not in captured.out


def test_a_finished_run_run_again_reuses_every_fit(zoo_root: Path, unstopped: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """The same command after a finished run trains nothing and gives the same tables; no empty resume folder
    stays behind; --fresh trains everything again."""
    zoo, request = Zoo.open(zoo_root, "resume"), BenchRequest(**REQUEST)
    before = _tables(unstopped)
    assert not (unstopped / ".resume").exists()
    trained: list[tuple[str, str]] = []
    outcome = run_bench(zoo, request, unstopped, on_done=lambda m, c, _: trained.append((m, c)))
    assert outcome.resumed == FITS and len(trained) == FITS, "every fit read back, none trained"
    assert _tables(unstopped) == before and not (unstopped / ".resume").exists()
    store = bench_store(zoo, request, unstopped)
    assert store.finished and len(store) == FITS
    store.clear()
    assert len(bench_store(zoo, request, unstopped)) == 0


SAVER = """
import sys
import numpy as np
from pathlib import Path
from nfn_baselines.bench.resume import Fit, FitStore
store = FitStore(Path(sys.argv[1]), Path(sys.argv[2]))
for i in range(int(sys.argv[4])):
    fit = Fit({"test": np.arange(5.0)}, {}, 0.5)
    store.save(None, f"model-{sys.argv[3]}-{i}", "all", fits=[fit], untuned=None, trials=None, seconds=1.0)
"""


@pytest.mark.slow
def test_savers_and_a_finisher_at_once_lose_no_fit(tmp_path: Path) -> None:
    """Four processes save into one run while another finishes it, eight times over: every record is kept (among
    the finished run's fits or the resumable ones) and no saver fails."""
    import subprocess
    import sys

    from nfn_baselines.bench.resume import FitStore
    from tests.helpers import PROJECT

    for trial in range(8):
        folder, kept = tmp_path / str(trial) / ".resume" / "run", tmp_path / str(trial) / ".fits" / "run"
        savers = [subprocess.Popen([sys.executable, "-c", SAVER, str(folder), str(kept), str(k), "25"], cwd=PROJECT,
                                   stderr=subprocess.PIPE, text=True) for k in range(4)]
        finisher = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                                     "from nfn_baselines.bench.resume import FitStore; time.sleep(0.3); "
                                     "FitStore(Path(sys.argv[1]), Path(sys.argv[2])).finish()", str(folder), str(kept)],
                                    cwd=PROJECT, stderr=subprocess.PIPE, text=True)
        for process in [*savers, finisher]:
            assert process.wait(timeout=120) == 0, process.stderr.read()
        assert len(FitStore(folder, kept)) == 100, trial
