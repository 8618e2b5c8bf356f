"""The builder's device code path on the CPU: an explicit device, bf16 autocast, hashed dropout masks (the
accelerator's source), the memory a run needs, measured, and group sizes from a given free-memory figure, and the same zoo whatever the group size."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from builders.batched import GroupDropout
from builders.memory import CALIBRATION_GROUPS, bytes_per_run
from builders.placement import check_precision, choose_group_size
from builders.grid import Run, run_seed
from builders.trainer import RunStreams, train_group
from small_transformer_zoo import Zoo
from small_transformer_zoo.format.architecture import mnist_spec
from small_transformer_zoo.devices import resolve_device
from tests.helpers import PROJECT, build_zoo, quiet, recipe

GIB = 1024 ** 3


def test_devices_are_resolved_or_refused() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    for bad in ("tpu", "cpu:1", "gpu"):
        with pytest.raises(ValueError, match=f"unknown device '{bad}'"):
            resolve_device(bad)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="sees no CUDA GPU"):
            resolve_device("cuda")
    with pytest.raises(ValueError, match="unknown precision 'fp16'"):
        check_precision(torch.device("cpu"), "fp16")
    if torch.ops.mkldnn._is_mkldnn_bf16_supported():
        check_precision(torch.device("cpu"), "bf16")
    else:
        with pytest.raises(ValueError, match="no native bf16 arithmetic"):
            check_precision(torch.device("cpu"), "bf16")


PEAK_RSS = """
import re, sys, torch
from builders.memory import probe_data, probe_runs
from builders.trainer import GroupTraining, Recipe
from small_transformer_zoo.format.architecture import mnist_spec
def status(key):
    return int(re.search(rf"{key}:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) * 1024
spec, runs, batch = mnist_spec(), int(sys.argv[1]), int(sys.argv[2])
data = probe_data(spec, batch, spec.num_tokens, torch.device("cpu"))
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS")
training = GroupTraining(probe_runs(runs), data, spec, Recipe(2, (), batch, True, "fp32"), "cpu", None, None)
for epoch in (1, 2):
    training.train_epoch(epoch, training.streams.epoch(batch, True, False))
print(status("VmHWM") - before)
"""


MEASURED = """
import sys, torch
from builders.memory import bytes_per_run, group_peak_bytes
from small_transformer_zoo.format.architecture import mnist_spec
spec, cpu, runs = mnist_spec(), torch.device("cpu"), int(sys.argv[1])
print(bytes_per_run(spec, 128, "fp32", spec.num_tokens, cpu, crop=True),
      group_peak_bytes(spec, runs, 128, "fp32", spec.num_tokens, cpu, True),
      bytes_per_run(spec, 128, "bf16", spec.num_tokens, cpu, crop=True))
"""


def peak_rss_of_a_group(runs: int, batch: int) -> int:
    """The rise of a fresh process's peak RSS while a group of Adam runs takes two steps with crops: the operating
    system's count, independent of the allocator figures the builder measures with (glibc told to map every block
    of 64 KiB or more on its own, so freed memory leaves the RSS)."""
    import sys

    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak RSS")
    done = subprocess.run([sys.executable, "-c", PEAK_RSS, str(runs), str(batch)], capture_output=True, text=True,
                          cwd=PROJECT, env=os.environ | {"MALLOC_MMAP_THRESHOLD_": "65536"}, check=True)
    return int(done.stdout.split()[-1])


def test_the_memory_per_run_is_measured_and_predicts_a_larger_groups_peak() -> None:
    """The per-run figure, measured on two small groups, predicts the peak of a group four times the larger one,
    within 25% of both the allocator's and the operating system's count (it needs more than the weight-sized
    state alone, and less than the old shape count's four-fold over-estimate)."""
    spec, runs = mnist_spec(), 4 * CALIBRATION_GROUPS[-1]
    # measured in a process of its own: a group of 24 runs and the profiler's record of it take more than 1 GB,
    # which the test suite's own process should not keep
    done = subprocess.run([sys.executable, "-c", MEASURED, str(runs)], capture_output=True, text=True, cwd=PROJECT,
                          check=True)
    per_run, allocated, per_run_bf16 = (int(word) for word in done.stdout.split()[-3:])
    assert 8 * 4 * spec.n_params < per_run < 40 * 2**20
    rss = peak_rss_of_a_group(runs, 128)
    for measured in (allocated, rss):
        assert abs(runs * per_run - measured) <= 0.25 * measured, (runs * per_run, allocated, rss)
    assert per_run_bf16 < per_run, "bf16 activations are smaller, so a bf16 run needs less"


def test_measuring_a_run_prints_nothing_and_leaves_stderr_working() -> None:
    """The profiler's native start and stop lines do not reach a build's output, and what is written to the standard
    error after the measurement still arrives."""
    code = ("import sys; import torch; from builders.memory import bytes_per_run; "
            "from small_transformer_zoo.format.architecture import mnist_spec; spec = mnist_spec(); "
            "figure = bytes_per_run(spec, 8, 'fp32', spec.num_tokens, torch.device('cpu')); "
            "print('after', file=sys.stderr); print(figure)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=PROJECT, check=True)
    assert done.stderr == "after\n" and int(done.stdout) > 0


def test_group_sizes_follow_the_free_memory_figure() -> None:
    """With a given free-memory figure the group is as large as fits in its 85%, and a group of that size, run in a
    fresh process, stays inside the figure."""
    spec, cpu = mnist_spec(), torch.device("cpu")
    per_run = bytes_per_run(spec, 128, "fp32", spec.num_tokens, cpu, crop=True)
    free = 2**30 // 2
    size = choose_group_size("auto", cpu, spec, 128, "fp32", spec.num_tokens, 1000, 4000, free_bytes=free, crop=True)
    assert size == int(free * 0.85) // per_run and size > 4
    assert peak_rss_of_a_group(size, 128) <= free
    assert choose_group_size("auto", cpu, spec, 16, "fp32", spec.num_tokens, 10, 4000, free_bytes=20 * GIB,
                             workers=2) == 10
    halves = choose_group_size("auto", cpu, spec, 128, "fp32", spec.num_tokens, 1000, 4000, free_bytes=free,
                               workers=2, crop=True)
    assert halves == int(free * 0.85) // 2 // per_run
    with pytest.raises(ValueError, match=r"group size 4096 does not fit on cpu: it needs [\d.]+ GiB .* 0.50 GiB free"):
        choose_group_size(4096, cpu, spec, 128, "fp32", spec.num_tokens, 10, 4000, free_bytes=free, crop=True)
    with pytest.raises(ValueError, match="not even one run fits"):
        choose_group_size("auto", cpu, spec, 128, "fp32", spec.num_tokens, 10, 4000, free_bytes=2**20, crop=True)


def test_on_an_accelerator_auto_takes_as_many_runs_as_fit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The accelerator's rule, given the per-run figure a GPU measured (20.9 MiB at batch 128 on an H200): as many
    runs as fit, up to the largest optimizer family and MAX_GROUP."""
    from builders import placement

    monkeypatch.setattr(placement, "bytes_per_run", lambda *args: 21 * 2**20)
    spec, gpu = mnist_spec(), torch.device("cuda")  # a device name only: the figures are given
    big = choose_group_size("auto", gpu, spec, 128, "fp32", spec.num_tokens, 10, 8000, free_bytes=140 * GIB)
    small = choose_group_size("auto", gpu, spec, 128, "fp32", spec.num_tokens, 10, 8000, free_bytes=8 * GIB)
    assert big == placement.MAX_GROUP and small == int(8 * GIB * 0.85) // (21 * 2**20)
    assert choose_group_size("auto", gpu, spec, 128, "fp32", spec.num_tokens, 10, 50, free_bytes=140 * GIB) == 50


def test_a_group_that_does_not_fit_fails_before_training(tmp_path) -> None:
    with pytest.raises(ValueError, match="group size 4 does not fit on cpu"):
        build_zoo("mnist", "tiny", tmp_path, group_size=4, free_bytes=2**20, device="cpu", log=quiet,
                  progress=False)
    assert not (tmp_path / "mnist-tiny").exists(), "nothing is written before the checks pass"


def test_hashed_dropout_masks_have_the_rates_and_their_own_streams() -> None:
    rates = [0.0, 0.05, 0.2]
    generators = [torch.Generator().manual_seed(seed) for seed in (1, 2, 3)]
    dropout = GroupDropout(rates, generators, sites=5)
    seeds = torch.tensor([11, 12, 13])
    dropout.draw((64, 49, 32), seeds)
    keep = dropout.keep.reshape(3, -1)
    for m, p in enumerate(rates):
        assert abs(float(keep[m].float().mean()) - (1 - p)) < 3e-3
    alone = GroupDropout([0.2], [torch.Generator()], sites=5)
    alone.draw((64, 49, 32), seeds[2:])
    assert torch.equal(alone.keep[0], dropout.keep[2]), "a model's masks depend on its own seed only"
    dropout.draw((64, 49, 32), torch.tensor([11, 12, 14]))
    assert torch.equal(dropout.keep[1], keep[1].view_as(dropout.keep[1]))
    assert 0.6 < float((dropout.keep[2] == alone.keep[0]).float().mean()) < 0.8, "a new seed, new masks"


def test_epoch_draws_are_per_run() -> None:
    spec = mnist_spec()
    runs = [Run(f"e-{i}", "sgd", fraction, 0.1, 1e-2, 0.2, 0.0, run_seed(f"e{i}"))
            for i, fraction in enumerate((1.0, 0.7))]
    together = RunStreams(runs, spec, 100)
    alone = RunStreams(runs[1:], spec, 100)
    a, b = together.epoch(16, crop=True, dropout_seeds=True), alone.epoch(16, crop=True, dropout_seeds=True)
    assert a.max_steps == 6 and a.steps.tolist() == [6, 4] and b.max_steps == 4, "full batches: 100 // 16, 70 // 16"
    assert torch.equal(a.order[1, :64], b.order[0]) and torch.equal(a.offsets[1, :64], b.offsets[0, :64])
    assert torch.equal(a.dropout_seeds[1, :4], b.dropout_seeds[0]) and a.weight[1].sum() == 64
    assert set(a.order[1, :64].tolist()) < set(together.subsets[1].tolist())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_training_on_an_explicit_device_and_precision(small_data, precision: str) -> None:
    """The device path on the CPU: explicit device, hashed or generator dropout, bf16 autocast; checkpoints stay
    float32 and bf16 trains the same runs to nearby weights."""
    spec = mnist_spec()
    runs = [Run(f"p-{i}", "adam", 1.0, dropout, 1e-3, 0.2, 1e-6, run_seed(f"p{i}")) for i, dropout in
            enumerate((0.0, 0.1))]
    checkpoints = train_group(runs, small_data, spec, recipe(1, [1], 32, precision=precision), "cpu")
    assert len(checkpoints) == 4 and all(c.params.dtype == np.float32 for c in checkpoints)
    assert all(0 <= c.metrics["test_accuracy"] <= 1 and not c.diverged for c in checkpoints)
    reference = train_group(runs, small_data, spec, recipe(1, [1], 32), "cpu")
    for mine, theirs in zip(checkpoints, reference):
        difference = np.abs(mine.params - theirs.params).max()
        assert (difference == 0) if precision == "fp32" else (0 < difference < 0.05)


@pytest.mark.slow
def test_the_same_zoo_whatever_the_group_size(tmp_path) -> None:
    build_zoo("mnist", "tiny", tmp_path / "four", progress=False, log=quiet, device="cpu")
    build_zoo("mnist", "tiny", tmp_path / "three", progress=False, log=quiet, device="cpu", group_size=3, workers=1)
    first, second = Zoo.open(tmp_path / "four", "mnist-tiny"), Zoo.open(tmp_path / "three", "mnist-tiny")
    for split in first.splits:
        a, b = first.metadata(split).to_pylist(), second.metadata(split).to_pylist()
        assert [r["checkpoint_id"] for r in a] == [r["checkpoint_id"] for r in b]
        assert a == b, "every metadata value, accuracies included, is the same"
        assert torch.equal(first.split_weights(split).to_tensor(), second.split_weights(split).to_tensor())


@pytest.mark.parametrize("argv,message", [
    (["--device", "tpu"], "unknown device 'tpu'"),
    (["--group-size", "4", "--workers", "1"], None),
    (["--group-size", "many"], "expected 'auto' or a number of runs"),
    (["--precision", "fp16"], "invalid choice: 'fp16'"),
])
def test_build_command_checks_its_placement(argv: list[str], message: str | None, tmp_path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    from small_transformer_zoo.cli import main

    command = ["build", "--task", "mnist", "--preset", "tiny", "--out", str(tmp_path), "--dry-run", *argv]
    if message is None:
        assert main(command) == 0
        printed = capsys.readouterr().out
        assert '"group_size": 4' in printed and '"device": "cpu"' in printed
        return
    try:
        code = main(command)
    except SystemExit as exit_:  # argparse's own usage errors
        code = exit_.code
    captured = capsys.readouterr()
    assert code == 2 and message in captured.err and "Traceback" not in captured.err
    if not torch.cuda.is_available():
        assert main(["build", "--task", "mnist", "--preset", "tiny", "--out", str(tmp_path), "--device", "cuda"]) == 2
        assert "sees no CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "mnist-tiny").exists()


@pytest.mark.slow
def test_identical_builds_write_identical_bytes_readable_by_the_team(tmp_path) -> None:
    """Two builds of the same plan in two processes give byte-identical shards and metadata (sorted safetensors
    headers; only zoo.json differs, by its creation time), and every file is created with the process umask (0644
    under 022), not mkstemp's 0600."""
    import hashlib
    import sys


    first = tmp_path / "first"
    build_zoo("mnist", "tiny", first, progress=False, log=quiet)
    script = ("import sys; from builders.build import BuildRequest, run_build; "
              "run_build(BuildRequest.of('mnist', 'tiny', sys.argv[1]), progress=False, log=lambda *_: None)")
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "second")], check=True, timeout=600,
                   cwd=PROJECT)

    def digests(root: Path) -> dict[str, str]:
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted((root / "mnist-tiny").rglob("*"))
                if p.is_file() and ".build" not in p.parts and p.name != "zoo.json"}

    assert digests(first) == digests(tmp_path / "second") and len(digests(first)) >= 4
    mask = os.umask(0o022)
    os.umask(mask)
    for path in (first / "mnist-tiny").rglob("*"):
        if path.is_file():
            assert path.stat().st_mode & 0o777 == 0o666 & ~mask, path


def test_hashed_dropout_training_does_not_depend_on_the_group(small_data) -> None:
    """The accelerator's way on the CPU: hashed masks, the next epoch's draws made while an epoch trains."""
    spec = mnist_spec()
    runs = [Run(f"h-{i}", "sgd_momentum", fraction, dropout, 1e-2, 0.2, 1e-6, run_seed(f"h{i}"))
            for i, (fraction, dropout) in enumerate(((1.0, 0.1), (0.8, 0.0), (0.9, 0.2)))]
    together = train_group(runs, small_data, spec, recipe(3, [1, 3], 32), hashed_dropout=True)
    alone = train_group(runs[2:], small_data, spec, recipe(3, [1, 3], 32), hashed_dropout=True)
    mine = [c for c in together if c.run is runs[2]]
    assert len(mine) == len(alone) == 3
    for a, b in zip(mine, alone):
        assert np.abs(a.params - b.params).max() < 1e-5 and a.metrics["test_accuracy"] == b.metrics["test_accuracy"]
    generator_masks = train_group(runs[2:], small_data, spec, recipe(3, [1, 3], 32))
    assert np.abs(generator_masks[-1].params - alone[-1].params).max() > 1e-4, "the two mask sources differ"


def test_a_second_writer_fails_at_once_naming_the_holder(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    from small_transformer_zoo.cli import main
    from small_transformer_zoo.store.files import LockedError, exclusive_lock

    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from small_transformer_zoo.store.files import exclusive_lock\n"
        "with exclusive_lock(sys.argv[1], 'mnist-tiny', 'a test holder'):\n"
        "    print('held', flush=True); sys.stdin.read()"), str(tmp_path)], stdout=subprocess.PIPE, text=True,
        stdin=subprocess.PIPE,
        cwd=PROJECT)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockedError, match=rf"is being written by pid {holder.pid} on .*a test holder"):
            build_zoo("mnist", "tiny", tmp_path, progress=False, log=quiet)
        assert main(["build", "--task", "mnist", "--preset", "tiny", "--out", str(tmp_path), "--no-progress"]) == 1
        assert f"pid {holder.pid}" in capsys.readouterr().err
        assert not (tmp_path / "mnist-tiny").exists(), "nothing trained or written"
    finally:
        holder.kill()
        holder.wait()
    with exclusive_lock(tmp_path, "mnist-tiny", "this test"):  # the kernel released the killed holder's lock
        assert f"pid {os.getpid()}" in (tmp_path / ".mnist-tiny.lock").read_text()


BF16_TOLERANCE = 0.05  # test accuracy: bf16 against fp32 on the same runs, mean absolute difference (0.027 measured)


@pytest.mark.slow
def test_bf16_trains_the_same_runs_to_the_accuracy_of_fp32() -> None:
    """bf16 autocast (weights, optimizer state and checkpoints float32) reaches fp32's test accuracy on the same
    runs within `BF16_TOLERANCE` on average (1,200 training and 600 test digits), on a CPU with bf16 arithmetic
    (AVX512-BF16 or AMX)."""
    from builders.data import load_embedded_mnist

    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("this CPU has no native bf16 arithmetic (AVX512-BF16 or AMX)")
    data = load_embedded_mnist()
    data.train_x, data.train_y = data.train_x[:1200], data.train_y[:1200]
    data.validation_x, data.validation_y = data.validation_x[:100], data.validation_y[:100]
    data.test_x, data.test_y = data.test_x[:600], data.test_y[:600]
    spec = mnist_spec()
    runs = [Run(f"b-{i}", "adam", 1.0, dropout, lr, 0.2, 1e-6, run_seed(f"b{i}"))
            for i, (dropout, lr) in enumerate([(0.0, 1e-3), (0.1, 1e-3), (0.0, 5e-4), (0.05, 2e-3)])]
    accuracy = {}
    for precision in ("fp32", "bf16"):
        checkpoints = train_group(runs, data, spec, recipe(6, [6], 16, augment=False, precision=precision))
        accuracy[precision] = np.array([c.metrics["test_accuracy"] for c in checkpoints if not c.is_best])
    assert accuracy["fp32"].mean() > 0.3, "the runs must have learned something to compare"
    assert np.abs(accuracy["bf16"] - accuracy["fp32"]).mean() <= BF16_TOLERANCE, accuracy
