"""Zoo builders: the grid, the data loaders, the vectorized trainer against torch.optim one model at a time,
and whole `tiny` builds: resumed after a real kill, sharded and merged, and refused on bad input."""

import gzip
import json
import os
import signal
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
import torch

from builders.batched import GroupDropout, VectorizedOptimizer, batched_logits, packed_views
from builders.parts import load_part, save_part
from builders.request import load_task_data
from builders.data import load_idx_folder, parse_idx
from builders.grid import FAMILY, OPTIMIZERS, PAPER_GRID, PRESETS, Run, full_grid, preset_runs, run_seed, shard_runs
from builders.tasks import get_task
from builders.reference import train_run_plain
from builders.trainer import CROP_FILL, Checkpoint, init_params, packed_init, random_crop, train_group
from small_transformer_zoo import Zoo, ZooFormatError
from small_transformer_zoo.devices import kernel_set
from small_transformer_zoo.format.architecture import ArchitectureSpec, mnist_spec
from small_transformer_zoo.weights.model import sinusoidal_positions
from tests.helpers import HANG_TIMEOUT, PROJECT, build_zoo, hub_dataset, quiet, recipe, shared_data



def test_paper_grid_and_presets() -> None:
    runs = full_grid("mnist")
    assert len(runs) == 16_000 and len({r.run_id for r in runs}) == 16_000
    assert {o: sum(r.optimizer == o for r in runs) for o in OPTIMIZERS} == dict.fromkeys(OPTIMIZERS, 4_000)
    assert len({r.seed for r in runs}) > 15_990
    stratified = preset_runs("mnist", PRESETS["tiny"])
    assert len(stratified) == 20 and {r.optimizer for r in stratified} == set(OPTIMIZERS)
    for name, count in (("mini", 132), ("medium", 240)):
        picked = preset_runs("mnist", PRESETS[name])
        assert len(picked) == count and len({r.run_id for r in picked}) == count
        for optimizer in OPTIMIZERS:
            mine = [r for r in picked if r.optimizer == optimizer]
            grid = PAPER_GRID[FAMILY[optimizer]]
            assert len(mine) == count // 4 and {r.learning_rate for r in mine} == set(grid["learning_rate"])
            base = [r for r in mine if (r.w_init_std, r.dropout, r.train_fraction, r.l2) == (0.2, 0.0, 1.0, 1e-6)]
            assert len(base) >= 8, "every learning rate at the base setting"
            if name == "medium":
                for key in ("train_fraction", "dropout", "w_init_std", "l2"):
                    assert {getattr(r, key) for r in mine} == set(grid[key]), (optimizer, key)


def test_shards_partition_the_runs() -> None:
    runs = preset_runs("mnist", PRESETS["mini"])
    shards = [shard_runs(runs, 3, i) for i in range(3)]
    ids = [r.run_id for shard in shards for r in shard]
    assert sorted(ids) == sorted(r.run_id for r in runs) and len(ids) == len(set(ids))
    with pytest.raises(ValueError, match="shard index 3"):
        shard_runs(runs, 3, 3)


@pytest.mark.parametrize("optimizer,lr", [("sgd", 0.05), ("sgd_momentum", 0.01), ("adam", 1e-3), ("rmsprop", 1e-3)])
def test_vectorized_training_matches_one_model_at_a_time(small_data, optimizer: str, lr: float) -> None:
    """Same numbers as torch.optim training each run alone, to float round-off. Adam and RMSprop divide by the
    root of tiny second moments in their first steps, so a round-off sign flip of a near-zero gradient can move
    single weights by up to about one step (lr); 99% of weights must agree to 1e-6."""
    spec = mnist_spec()
    runs = [Run(f"t-{optimizer}-{i}", optimizer, fraction, 0.0, lr * (i + 1), 0.2, 1e-4, run_seed(f"t{i}{optimizer}"))
            for i, fraction in enumerate((1.0, 0.7, 0.9))]
    checkpoints = train_group(runs, small_data, spec, recipe(1, [1]))
    for run in runs:
        alone, history = train_run_plain(run, small_data, spec, epochs=1, checkpoint_epochs=[1])
        final = next(c for c in checkpoints if c.run is run and not c.is_best)
        assert abs(history[1]["validation_accuracy"] - final.metrics["validation_accuracy"]) <= 1.5 / 64
        assert abs(history[1]["test_accuracy"] - final.metrics["test_accuracy"]) <= 1.5 / 64
        packed = torch.cat([alone[p.name].reshape(-1) for p in spec.parameters()])
        together = torch.from_numpy(final.params)
        initial = torch.cat([t.reshape(-1) for t in
                             init_params(spec, run.w_init_std, torch.Generator().manual_seed(run.seed)).values()])
        assert (packed - initial).abs().max() > 1e-4, "training must have moved the weights"
        difference = (together - packed).abs()
        assert difference.median() < 1e-7 and (difference > 1e-6).float().mean() < 1e-2, difference.max()
        assert difference.max() < (1e-5 if optimizer.startswith("sgd") else 3 * run.learning_rate)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_an_optimizer_update_does_not_depend_on_an_idle_model_beside_it(optimizer: str) -> None:
    """A model's update is the same bits whether every model of its group steps or one beside it does not, and the
    one that does not step keeps its weights."""
    generator = torch.Generator().manual_seed(7)
    weights, grads = torch.randn(3, 40, generator=generator), torch.randn(5, 3, 40, generator=generator)
    l2, lr = torch.tensor([1e-4, 0.0, 1e-3]), torch.tensor([1e-3, 2e-2, 5e-4])

    def trained(models: int, active: torch.Tensor) -> VectorizedOptimizer:
        params = weights[:models].clone().requires_grad_()
        update = VectorizedOptimizer(optimizer, params, l2[:models])
        for grad in grads:
            params.grad = grad[:models].clone()
            update.step(lr[:models], active)
        return update

    everyone = trained(2, torch.tensor([True, True]))
    beside_idle = trained(3, torch.tensor([True, True, False]))
    assert torch.equal(everyone.params[:2], beside_idle.params[:2])
    assert torch.equal(beside_idle.params[2], weights[2])
    assert not torch.equal(everyone.params, weights[:2])
    for name, state in everyone.state.items():
        assert torch.equal(state, beside_idle.state[name][:2]), name


def test_group_dropout_rates_scaling_and_own_streams() -> None:
    rates = [0.0, 0.05, 0.2]
    generators = [torch.Generator().manual_seed(seed) for seed in (1, 2, 3)]
    dropout = GroupDropout(rates, generators, sites=5)
    dropout.draw((64, 49, 32))
    keep = dropout.keep.reshape(3, -1)
    assert keep.shape[1] == 5 * 64 * 49 * 32
    for m, p in enumerate(rates):
        assert abs(float(keep[m].float().mean()) - (1 - p)) < 3e-3, (p, float(keep[m].float().mean()))
        assert float(dropout.scale[m]) == pytest.approx(1 / (1 - round(p * 65536) / 65536), rel=1e-7)
    assert torch.equal(generators[0].get_state(), torch.Generator().manual_seed(1).get_state()), "rate 0 draws nothing"
    alone = GroupDropout([0.2], [torch.Generator().manual_seed(3)], sites=5)
    alone.draw((64, 49, 32))
    assert torch.equal(alone.keep[0], dropout.keep[2]), "a model's masks do not depend on its group"
    x = torch.ones(3, 64, 49, 32)
    expected = dropout.keep[:, 4] * dropout.scale.view(3, 1, 1, 1)
    assert torch.equal(dropout(dropout.scaled(x), 4), expected), "inverted dropout: kept elements scaled by 1/(1-p)"


def test_dropout_in_the_forward_pass_is_inverted_dropout() -> None:
    """Folding the keep scale into the layer before each site computes the same function as scaling the output."""
    spec = mnist_spec()
    runs = [Run(f"d-{i}", "adam", 1.0, p, 1e-3, 0.3, 0.0, run_seed(f"d{i}")) for i, p in enumerate((0.0, 0.2))]
    generators = [torch.Generator().manual_seed(r.seed) for r in runs]
    packed = packed_init(spec, runs, generators).double()
    params = packed_views(spec, packed)
    images = torch.randn(2, 8, 1, 28, 28, dtype=torch.float64)
    positions = sinusoidal_positions(spec.num_tokens, spec.d_model).double()
    dropout = GroupDropout([r.dropout for r in runs], generators, sites=5)
    dropout.draw((8, spec.num_tokens, spec.d_model))
    folded = batched_logits(spec, params, images, positions, dropout)

    class OutputScaled:
        """Reference: plain inverted dropout, mask times 1/(1-p) applied to each site's output."""

        def __call__(self, x: torch.Tensor, site: int) -> torch.Tensor:
            return x * dropout.keep[:, site] * dropout.scale.double().view(-1, 1, 1, 1)

        def scaled(self, tensor: torch.Tensor) -> torch.Tensor:
            return tensor

    reference = batched_logits(spec, params, images, positions, OutputScaled())
    assert torch.allclose(folded, reference, rtol=1e-10, atol=1e-12)
    assert not torch.allclose(folded[1], batched_logits(spec, params, images, positions)[1], atol=1e-3)
    assert torch.equal(folded[0], batched_logits(spec, params, images, positions)[0]), "rate 0: no dropout at all"


def test_random_crop_pads_with_black() -> None:
    """torchvision pads the raw image (black) before normalising; the normalised images are padded with -1."""
    images = torch.ones(2, 1, 28, 28)
    cropped = random_crop(images, torch.tensor([[0, 0], [4, 2]]))
    assert (cropped[0, 0, :2] == CROP_FILL).all() and (cropped[0, 0, :, :2] == CROP_FILL).all()
    assert (cropped[0, 0, 2:, 2:] == 1).all() and (cropped[1, 0, -2:] == CROP_FILL).all()
    assert (cropped[1, 0, :-2] == 1).all() and CROP_FILL == (0.0 - 0.5) / 0.5


def test_pixels_are_normalised_to_within_one_float32_step_of_their_exact_value() -> None:
    """Every byte value v becomes (v / 255 - 0.5) / 0.5 = 2v/255 - 1 within float32 rounding, on a new [N, 1, 28, 28]
    array; the input is left as it was."""
    from builders.data import _normalise_images

    values = np.arange(256, dtype=np.uint8)
    images = np.broadcast_to(values[:, None, None], (256, 28, 28)).copy()
    normalised = _normalise_images(images)
    assert normalised.shape == (256, 1, 28, 28) and normalised.dtype == np.float32
    exact = 2.0 * values.astype(np.float64) / 255.0 - 1.0
    got = normalised[:, 0].reshape(256, -1)
    assert (got == got[:, :1]).all()
    assert np.abs(got[:, 0] - exact).max() <= 2 * np.finfo(np.float32).eps
    assert got[0, 0] == -1.0 and got[255, 0] == 1.0 and (np.diff(got[:, 0]) > 0).all()
    assert (images == values[:, None, None]).all()


def test_a_runs_training_does_not_depend_on_its_group(small_data) -> None:
    spec = mnist_spec()
    runs = [Run(f"g-{i}", "adam", 0.8, dropout, 3e-3, 0.3, 1e-6, run_seed(f"g{i}"))
            for i, dropout in enumerate((0.1, 0.0, 0.2))]
    together = train_group(runs, small_data, spec, recipe(2, [2]))
    alone = train_group(runs[2:], small_data, spec, recipe(2, [2]))
    mine = next(c for c in together if c.run is runs[2] and not c.is_best)
    assert np.abs(mine.params - alone[0].params).max() < 1e-4
    assert mine.metrics["test_accuracy"] == pytest.approx(alone[0].metrics["test_accuracy"], abs=1.5 / 64)


def test_idx_loader_on_the_real_mnist_test_set(tmp_path: Path) -> None:
    """A folder of test files only is refused, unless the user asks to carve it; then every record says so."""
    with pytest.raises(ZooFormatError, match=r"no train-images-idx3-ubyte\[.gz\] here, only the test files; pass "
                                             r"--carve-from-test"):
        load_idx_folder(shared_data("mnist"), "mnist")
    with pytest.raises(ZooFormatError, match="--carve-from-test"):
        build_zoo("mnist", "tiny", tmp_path, data_dir=shared_data("mnist"))
    assert not (tmp_path / "mnist-tiny").exists()
    data = load_idx_folder(shared_data("mnist"), "mnist", carve_from_test=True)
    assert len(data.train_y) + len(data.validation_y) == 8_000 and len(data.test_y) == 2_000
    assert data.train_x.shape[1:] == (1, 28, 28) and abs(float(data.train_x.mean()) + 0.74) < 0.1
    assert data.source["carved_from_test"] and "carved 80/20" in data.source["files"]


def test_idx_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "t10k-images-idx3-ubyte.gz"
    bad.write_bytes(gzip.compress(b"\x00\x00\x08\x01" + b"\x00" * 20))
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x01\x03")
    with pytest.raises(ZooFormatError, match="t10k-images-idx3-ubyte.gz: wrong IDX magic number 0x00000801"):
        load_idx_folder(tmp_path, "mnist")
    with pytest.raises(ZooFormatError, match="header says shape"):
        parse_idx(b"\x00\x00\x08\x01\x00\x00\x00\x05\x01", tmp_path / "x", 1)
    images = np.zeros((1, 28, 28), np.uint8)
    bad.write_bytes(gzip.compress(b"\x00\x00\x08\x03" + np.array([1, 28, 28], ">u4").tobytes() + images.tobytes()))
    (tmp_path / "t10k-labels-idx1-ubyte").write_bytes(b"\x00\x00\x08\x01\x00\x00\x00\x01\x0c")
    with pytest.raises(ZooFormatError, match="t10k-labels-idx1-ubyte: 1 labels out of range 0..9"):
        load_idx_folder(tmp_path, "mnist")


def _params(root: Path, config: str) -> dict[str, torch.Tensor]:
    zoo = Zoo.open(root, config)
    out = {}
    for split in zoo.splits:
        weights = zoo.split_weights(split)
        for cid, row in zip(weights.metadata.column("checkpoint_id").to_pylist(), weights.to_tensor()):
            out[cid] = row
    return out


@pytest.fixture(scope="module")
def tiny_build(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "zoo"
    build_zoo("mnist", "tiny", out, progress=False, log=quiet)
    return out


def test_tiny_build_writes_a_verified_zoo(tiny_build: Path) -> None:
    zoo = Zoo.open(tiny_build, "mnist-tiny")
    assert zoo.verify() == []
    assert zoo.manifest["counts"]["runs"] == 20 and zoo.manifest["checkpoint_epochs"] == [1, 2, "best"]
    assert zoo.manifest["provenance"]["build_plan"]["preset"] == "tiny"
    assert zoo.manifest["provenance"]["kernels"] == [kernel_set("cpu")]
    rows = [r for s in zoo.splits for r in zoo.metadata(s).to_pylist()]
    assert len(rows) == 20 * 3
    for run_id in {r["run_id"] for r in rows}:
        mine = [r for r in rows if r["run_id"] == run_id]
        best = next(r for r in mine if r["is_best"])
        assert best["validation_accuracy"] >= max(r["validation_accuracy"] for r in mine if not r["is_best"])
        assert all(0 <= r["test_accuracy"] <= 1 and r["seed"] == run_seed(run_id) for r in mine)
    accuracies = [r[k] for r in rows for k in ("train_accuracy", "validation_accuracy", "test_accuracy")]
    exact = [float(Fraction(a).limit_denominator(100_000)) == a for a in accuracies]
    assert all(exact), "accuracies are counts over totals (a float64 quotient), without float32 noise"
    assert build_zoo("mnist", "tiny", tiny_build, progress=False, log=quiet)["config"] == "mnist-tiny"  # reused


def test_the_kernel_set_is_the_one_torch_computes_with() -> None:
    """`kernel_set` reads torch's CPU capability, which ATEN_CPU_CAPABILITY lowers: a build records what ran."""
    script = "from small_transformer_zoo.devices import kernel_set; print(kernel_set('cpu'))"
    lowered = subprocess.run([sys.executable, "-c", script], cwd=PROJECT, capture_output=True, text=True, check=True,
                             env={**os.environ, "ATEN_CPU_CAPABILITY": "default"})
    assert lowered.stdout.strip() == "cpu DEFAULT"
    assert kernel_set("cpu") == f"cpu {torch.backends.cpu.get_cpu_capability()}"


def test_a_part_names_its_kernel_set_or_says_it_is_unknown(tmp_path: Path) -> None:
    run = preset_runs("mnist", PRESETS["tiny"])[0]
    checkpoint = Checkpoint(run, 1, False, np.arange(4, dtype=np.float32), {"validation_accuracy": 0.5}, False)
    save_part(tmp_path, "recorded", [checkpoint], "cpu", "cpu AVX2")
    save_part(tmp_path, "older", [checkpoint], "cpu")
    assert load_part(tmp_path, "recorded")[1:] == ({"cpu"}, {"cpu AVX2"})
    assert load_part(tmp_path, "older")[1:] == ({"cpu"}, {"unknown"})
    assert load_part(tmp_path, "recorded")[0][0].params.tolist() == [0.0, 1.0, 2.0, 3.0]


KILL_AFTER_FIRST_PART = """
import os, signal, sys
import builders.build as build
save = build.save_part
def save_then_die(*args, **kwargs):
    save(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
build.save_part = save_then_die
from small_transformer_zoo.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_killed_build_resumes_to_the_same_zoo(tiny_build: Path, tmp_path: Path) -> None:
    """A real SIGKILL at a fixed point: the build process kills itself right after its first part is on disk."""
    out = tmp_path / "resumed"
    arguments = ["build", "--task", "mnist", "--preset", "tiny", "--out", str(out), "--no-progress", "--workers", "1"]
    killed = subprocess.run([sys.executable, "-c", KILL_AFTER_FIRST_PART, *arguments], cwd=PROJECT,
                            capture_output=True, timeout=HANG_TIMEOUT)
    assert killed.returncode == -signal.SIGKILL
    parts = out / "mnist-tiny" / ".build" / "parts"
    assert len(list(parts.glob("*.json"))) == 1 and not (out / "mnist-tiny" / "zoo.json").exists()
    resumed = subprocess.run([sys.executable, "-m", "small_transformer_zoo.cli", *arguments], cwd=PROJECT,
                             capture_output=True, text=True, timeout=HANG_TIMEOUT)
    assert resumed.returncode == 0 and "resuming: 5 of 20 runs already trained" in resumed.stdout + resumed.stderr
    first, second = _params(tiny_build, "mnist-tiny"), _params(out, "mnist-tiny")
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)


def test_a_crash_while_putting_the_zoo_in_place_keeps_every_trained_part(tiny_build: Path, tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The build fails at the rename that puts zoo.json in place: no zoo, every trained part kept, and the rerun
    assembles the zoo without training anything again."""
    rename = os.replace

    def fail_at_the_manifest(source: str, target: str) -> None:
        if Path(target).name == "zoo.json":
            raise OSError("simulated crash")
        rename(source, target)

    monkeypatch.setattr(os, "replace", fail_at_the_manifest)
    with pytest.raises(OSError, match="simulated crash"):
        build_zoo("mnist", "tiny", tmp_path / "out", progress=False, log=quiet)
    config = tmp_path / "out" / "mnist-tiny"
    assert not (config / "zoo.json").exists() and len(list((config / ".build" / "parts").glob("*.json"))) == 4
    monkeypatch.setattr(os, "replace", rename)
    said: list[str] = []
    build_zoo("mnist", "tiny", tmp_path / "out", progress=False, log=said.append)
    assert "resuming: 20 of 20 runs already trained" in said and "training on cpu: 0 groups of up to 5 runs" in said
    assert not (config / ".build").exists()
    first, second = _params(tiny_build, "mnist-tiny"), _params(tmp_path / "out", "mnist-tiny")
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)
    (config / ".build" / "parts").mkdir(parents=True)  # as a build killed after its zoo was in place leaves it
    build_zoo("mnist", "tiny", tmp_path / "out", progress=False, log=quiet)
    assert not (config / ".build").exists()


@pytest.mark.slow
def test_sharded_build_merges_to_the_same_zoo(tiny_build: Path, tmp_path: Path) -> None:
    from builders.build import BuildRequest, merge_shards

    for index in range(2):
        build_zoo("mnist", "tiny", tmp_path / f"shard{index}", num_shards=2, shard_index=index, progress=False,
                  log=quiet)
    with pytest.raises(ZooFormatError, match="10 runs missing"):
        merge_shards(BuildRequest.of("mnist", "tiny", tmp_path / "merged"), [tmp_path / "shard0"])
    with pytest.raises(ZooFormatError, match="run mnist-.* is present twice"):
        merge_shards(BuildRequest.of("mnist", "tiny", tmp_path / "merged"), [tmp_path / "shard0", tmp_path / "shard0"])
    merge_shards(BuildRequest.of("mnist", "tiny", tmp_path / "merged"), [tmp_path / "shard0", tmp_path / "shard1"])
    first, merged = _params(tiny_build, "mnist-tiny"), _params(tmp_path / "merged", "mnist-tiny")
    assert first.keys() == merged.keys() and all(torch.equal(first[k], merged[k]) for k in first)


@pytest.mark.slow
def test_one_group_at_a_time_on_every_core_makes_the_same_zoo(tiny_build: Path, tmp_path: Path) -> None:
    """The default trains one group per core, one thread each; one group on all cores gives the same weights."""
    build_zoo("mnist", "tiny", tmp_path / "serial", progress=False, workers=1, log=quiet)
    first, serial = _params(tiny_build, "mnist-tiny"), _params(tmp_path / "serial", "mnist-tiny")
    assert first.keys() == serial.keys() and all(torch.equal(first[k], serial[k]) for k in first)


def test_bad_build_input_fails_before_training(tiny_build: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown task 'cifar'"):
        build_zoo("cifar", "tiny", tmp_path, log=quiet)
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        build_zoo("mnist", "huge", tmp_path, log=quiet)
    manifest = json.loads((tiny_build / "mnist-tiny" / "zoo.json").read_text())
    other = tmp_path / "other"
    (other / "mnist-tiny").mkdir(parents=True)
    manifest["architecture"]["d_mlp"] = 128
    wider = ArchitectureSpec.from_dict(manifest["architecture"])
    manifest["n_params"], manifest["parameters"] = wider.n_params, [p.to_dict() for p in wider.parameters()]
    (other / "mnist-tiny" / "zoo.json").write_text(json.dumps(manifest))
    with pytest.raises(ZooFormatError, match="holds a zoo of another architecture"):
        build_zoo("mnist", "tiny", other, log=quiet)
    assert json.loads((other / "mnist-tiny" / "zoo.json").read_text()) == manifest


@pytest.mark.ray
@pytest.mark.slow
def test_ray_build_on_a_local_instance_makes_the_same_zoo(tiny_build: Path, tmp_path: Path) -> None:
    ray = pytest.importorskip("ray", reason="Ray is an optional extra (pip install 'small-transformer-zoo[ray]')")
    from builders.distributed import ray_executor

    try:
        build_zoo("mnist", "tiny", tmp_path / "ray", progress=False, log=quiet,
                  executor=ray_executor(num_cpus=2))
    finally:
        ray.shutdown()
    first, second = _params(tiny_build, "mnist-tiny"), _params(tmp_path / "ray", "mnist-tiny")
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_ag_news_text_zoo_from_the_real_test_set(tmp_path: Path) -> None:
    """The text zoo: a frozen embedding built from the corpus, stored once, padding masked; from real AG News."""
    from builders.text import load_ag_news

    folder = shared_data("ag_news")
    with pytest.raises(ZooFormatError, match="no train.csv here, only the test files; pass --carve-from-test"):
        load_ag_news(folder, max_train=256)
    data = load_ag_news(folder, max_train=256, carve_from_test=True)
    assert data.embedding.shape == (5_000, 32) and not data.embedding[0].any()
    assert data.source["carved_from_test"] and len(data.test_y) == 1_520
    again = load_ag_news(folder, max_train=256, carve_from_test=True)
    assert np.array_equal(again.embedding, data.embedding), "the embedding must be deterministic"
    manifest = build_zoo("agnews", "tiny", tmp_path, data_dir=folder, carve_from_test=True)
    assert manifest["task"]["source"]["carved_from_test"]
    assert "Trained on samples of its data set's test half" in (tmp_path / "README.md").read_text()
    zoo = Zoo.open(tmp_path, "agnews-tiny")
    assert zoo.verify() == [] and zoo.spec.modality == "text" and zoo.spec.num_classes == 4
    assert np.array_equal(zoo.extras()["embedding"]["table"], data.embedding)
    assert manifest["task"]["source"]["embedding_sha256"] == data.source["embedding_sha256"]
    accuracies = [a for s in zoo.splits for a in zoo.metadata(s).column("test_accuracy").to_pylist()]
    assert all(0 <= a <= 1 for a in accuracies)


def test_ag_news_and_mnist_from_the_hub(hub, tmp_path: Path) -> None:
    """`--data-dir hf://datasets/<repo>` loads a task's data through `datasets` from the (loopback) Hub; the
    source is recorded, and a repo without the right columns is refused before training."""
    import datasets
    from PIL import Image

    from builders.data import read_ag_news_csv

    texts, labels = read_ag_news_csv(shared_data("ag_news") / "test.csv")
    hub.add_dataset("fancyzhx/ag_news", hub_dataset(tmp_path / "ag", {
        "train": {"text": texts[:1200], "label": labels[:1200].tolist()},
        "test": {"text": texts[1200:1600], "label": labels[1200:1600].tolist()}}))
    manifest = build_zoo("agnews", "tiny", tmp_path / "out", data_dir="hf://datasets/fancyzhx/ag_news",
                         progress=False, log=quiet)
    assert manifest["task"]["source"]["from"] == "hf://datasets/fancyzhx/ag_news"
    assert Zoo.open(tmp_path / "out", "agnews-tiny").verify() == []

    digits = load_idx_folder(shared_data("mnist"), "mnist", carve_from_test=True)
    pixels = np.clip(np.rint((digits.train_x[:, 0] * 0.5 + 0.5) * 255), 0, 255).astype(np.uint8)
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)})
    hub.add_dataset("ylecun/mnist", hub_dataset(tmp_path / "mnist", {
        "train": {"image": [Image.fromarray(p) for p in pixels[:600]], "label": digits.train_y[:600].tolist()},
        "test": {"image": [Image.fromarray(p) for p in pixels[600:800]], "label": digits.train_y[600:800].tolist()}},
        features))
    data = load_task_data(get_task("mnist"), "hf://datasets/ylecun/mnist", PRESETS["tiny"])
    assert data.source["from"] == "hf://datasets/ylecun/mnist" and len(data.test_y) == 200
    assert np.allclose(data.test_x[:, 0], digits.train_x[600:800, 0], atol=1e-6), "pixels survive the round trip"
    assert len(data.validation_y) == 60 and len(data.train_y) == 256, "10% held out, the rest capped by `tiny`"

    hub.add_dataset("someone/not-mnist", hub_dataset(tmp_path / "bad", {
        "train": {"text": ["a"], "label": [0]}, "test": {"text": ["b"], "label": [1]}}))
    with pytest.raises(ZooFormatError, match="hf://datasets/someone/not-mnist: needs a 'train' split with columns"):
        load_task_data(get_task("mnist"), "hf://datasets/someone/not-mnist", PRESETS["tiny"])


def test_ag_news_with_a_users_word2vec_file(tmp_path: Path) -> None:
    """`stz build --word2vec FILE`: the embedding comes from the file (PCA to 32), recorded in the manifest."""
    from collections import Counter

    from builders.data import read_ag_news_csv
    from builders.text import load_ag_news, tokenize
    from small_transformer_zoo.cli import main

    folder = shared_data("ag_news")
    texts, _ = read_ag_news_csv(folder / "test.csv")
    words = [w for w, _ in Counter(w for text in texts for w in tokenize(text)).most_common(400)]
    vectors = np.random.default_rng(7).normal(size=(len(words), 50))
    vector_file = tmp_path / "vectors.txt"
    vector_file.write_text(f"{len(words)} 50\n" + "".join(f"{w} {' '.join(f'{v:.5f}' for v in row)}\n"
                                                          for w, row in zip(words, vectors)))
    data = load_ag_news(folder, max_train=256, word2vec=vector_file, carve_from_test=True)
    assert data.embedding.shape == (5_000, 32) and data.source["embedding"] == f"word2vec file {vector_file}"
    assert 300 < int((np.abs(data.embedding).sum(1) > 0).sum()) <= 400, "rows for the file's words, zero elsewhere"
    corpus_built = load_ag_news(folder, max_train=256, carve_from_test=True)
    assert data.source["sha256"] != corpus_built.source["sha256"]
    assert main(["build", "--task", "agnews", "--preset", "tiny", "--out", str(tmp_path / "zoo"), "--data-dir",
                 str(folder), "--carve-from-test", "--word2vec", str(vector_file), "--no-progress"]) == 0
    zoo = Zoo.open(tmp_path / "zoo", "agnews-tiny")
    assert np.array_equal(zoo.extras()["embedding"]["table"], data.embedding)
    assert zoo.manifest["task"]["source"]["embedding"].startswith("word2vec file")
    (tmp_path / "ragged.txt").write_text("".join(f"{w} 1.0 2.0\n" for w in words[:40]) + f"{words[40]} 1.0\n")
    with pytest.raises(ZooFormatError, match="ragged.txt: vectors of different lengths"):
        load_ag_news(folder, max_train=256, word2vec=tmp_path / "ragged.txt", carve_from_test=True)
    with pytest.raises(ValueError, match="--word2vec is for text tasks, not .mnist."):
        load_task_data(get_task("mnist"), None, PRESETS["tiny"], word2vec=vector_file)


def test_ag_news_csv_errors_name_the_line(tmp_path: Path) -> None:
    from builders.data import read_ag_news_csv

    path = tmp_path / "test.csv"
    path.write_text('"3","Title","Body"\n"7","Bad","Label"\n')
    with pytest.raises(ZooFormatError, match=r"test.csv: line 2: class index 7 is out of range 1..4"):
        read_ag_news_csv(path)
    path.write_text('"3","only two"\n')
    with pytest.raises(ZooFormatError, match=r"line 1: expected 3 columns"):
        read_ag_news_csv(path)


def test_fashion_mnist_from_the_debian_package(tmp_path: Path) -> None:
    from builders.data import FASHION_MNIST_DIR

    if not (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"{FASHION_MNIST_DIR} is absent (apt-get install dataset-fashion-mnist)")
    data = load_idx_folder(FASHION_MNIST_DIR, "fashion_mnist")
    assert len(data.train_y) + len(data.validation_y) == 60_000 and len(data.test_y) == 10_000
    assert data.source["files"] == "train and t10k files"


@pytest.mark.parametrize("task", ["mnist", "agnews"])
def test_the_wide_preset_covers_the_grid_with_enough_test_runs(task: str) -> None:
    """`wide` on each task: at least 1,500 runs, every value of every hyperparameter, at least 225 test runs under
    the default split (the runs the benchmark's intervals rest on)."""
    from collections import Counter

    from small_transformer_zoo.format.splits import assign_split

    runs = preset_runs(task, PRESETS["wide"].for_task(task))
    assert len(runs) >= 1500 and len({r.run_id for r in runs}) == len(runs)
    assert {r.optimizer for r in runs} == set(OPTIMIZERS)
    for optimizer in OPTIMIZERS:
        for name, values in PAPER_GRID[FAMILY[optimizer]].items():
            assert {getattr(r, name) for r in runs if r.optimizer == optimizer} == set(values), (optimizer, name)
    assert Counter(assign_split(r.run_id) for r in runs)["test"] >= 225
