"""Files that change under a reader: overwrites and replacements read as one whole version, a second
writer fails at once, a writer killed at any step leaves the old zoo or the new one, and no writer follows a link
or waits on a pipe."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from small_transformer_zoo import Zoo, ZooFormatError, load_dataset, mnist_spec
from small_transformer_zoo.store.snapshot import manifest_files
from tests.core.faults.read_paths import read_labelled
from tests.helpers import HANG_TIMEOUT, PROJECT, shard_file


def _two_versions(tmp_path: Path) -> dict[int, tuple[torch.Tensor, list[float]]]:
    """Two versions of one config (seeds 1 and 2), each written to a folder of its own: weights and labels."""
    from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

    versions = {}
    for seed in (1, 2):
        write_synthetic_zoo(tmp_path / f"v{seed}", "syn", runs=8, seed=seed, register=False)
        versions[seed] = read_labelled(tmp_path / f"v{seed}", "fast path")
    return versions


def _which_version(got: tuple[torch.Tensor, list[float]], versions: dict) -> int:
    match = [seed for seed, (params, labels) in versions.items()
             if torch.equal(got[0], params) and got[1] == pytest.approx(labels, rel=1e-6)]
    assert match, "a read returned a mix of two versions, or neither"
    return match[0]


@pytest.mark.parametrize("read", ["fast path", "load_dataset", "streaming"])
def test_readers_during_overwrites_get_one_version_whole(read: str, tmp_path: Path, stz_home: Path) -> None:
    """A bounded loop of in-place replacements (two versions of one config) under a concurrent reader: every read
    returns one version whole, weights and labels together, with no error at all."""
    import threading

    from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

    versions = _two_versions(tmp_path)
    root = tmp_path / "live"
    write_synthetic_zoo(root, "syn", runs=8, seed=1, register=False)
    done = threading.Event()
    outcomes = {1: 0, 2: 0}

    def rewrite() -> None:
        for i in range(30):
            write_synthetic_zoo(root, "syn", runs=8, seed=1 + i % 2, register=False, overwrite=True)
        done.set()

    writer = threading.Thread(target=rewrite)
    writer.start()
    try:
        while not done.is_set() or sum(outcomes.values()) < 5:
            outcomes[_which_version(read_labelled(root, read), versions)] += 1
    finally:
        writer.join()
    assert outcomes[1] + outcomes[2] >= 5, outcomes


@pytest.mark.parametrize("read", ["Zoo", "load_dataset", "streaming"])
def test_a_reader_opened_before_a_replace_reads_its_version_whole(read: str, tmp_path: Path, stz_home: Path) -> None:
    """A zoo opened (a Zoo, a prepared or a streaming dataset), then replaced by a new version, whose writer
    removes the old version's files: the reader still reads the version it opened, all of it."""
    from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

    versions = _two_versions(tmp_path)
    root = tmp_path / "live"
    write_synthetic_zoo(root, "syn", runs=8, seed=1, register=False)
    if read == "Zoo":
        opened = Zoo.open(root, "syn")
    else:
        opened = load_dataset(str(root), "syn", streaming=read == "streaming",
                              cache_dir=str(tmp_path / "datasets-cache"))
    write_synthetic_zoo(root, "syn", runs=8, seed=2, register=False, overwrite=True)
    old_files = {p.name for p in (tmp_path / "v1" / "syn" / "weights").iterdir()}
    assert not old_files & {p.name for p in (root / "syn" / "weights").iterdir()}, "the old files are gone"
    if read == "Zoo":
        weights = opened.split_weights("train")
        got = weights.to_tensor(), weights.metadata.column("test_accuracy").to_pylist()
        assert opened.verify() == []
    else:
        rows = list(opened["train"].with_format("torch"))
        got = torch.stack([r["params"] for r in rows]), [float(r["test_accuracy"]) for r in rows]
    assert _which_version(got, versions) == 1
    assert _which_version(read_labelled(root, "fast path"), versions) == 2


def test_a_reader_pickled_into_another_process_reopens_its_version_or_says_it_is_gone(tmp_path: Path,
                                                                                      stz_home: Path) -> None:
    """A Zoo travels to a worker as its manifest's bytes: unpickled, it opens that version's files again, or, when a
    newer version has removed them, fails with ZooReplacedError instead of reading another version."""
    import pickle

    from small_transformer_zoo.errors import ZooReplacedError
    from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

    versions = _two_versions(tmp_path)
    root = tmp_path / "live"
    write_synthetic_zoo(root, "syn", runs=8, seed=1, register=False)
    pickled = pickle.dumps(Zoo.open(root, "syn"))
    again = pickle.loads(pickled).split_weights("train")
    assert _which_version((again.to_tensor(), again.metadata.column("test_accuracy").to_pylist()), versions) == 1
    write_synthetic_zoo(root, "syn", runs=8, seed=2, register=False, overwrite=True)
    with pytest.raises(ZooReplacedError, match=r"zoo.json: was replaced by a newer version after this reader opened "
                                               r"it, and that version's files are gone; open it again"):
        pickle.loads(pickled)


HOLD_A_WRITER = """
import sys, time
from small_transformer_zoo import ZooWriter, mnist_spec
writer = ZooWriter(sys.argv[1], "syn", mnist_spec(), overwrite=True, register=False)
print("held", flush=True)
sys.stdin.read()  # held until the test kills this process
"""


def test_a_second_zoo_writer_on_a_config_fails_at_once_naming_the_holder(tmp_path: Path, stz_home: Path) -> None:
    """`ZooWriter` itself holds the config's lock from its creation to `close()`: a second writer in another
    process or another thread fails at once and the zoo is untouched; the lock is free again after a close, after
    a failed write, and after the holder is killed."""
    import subprocess
    import sys
    import threading

    from small_transformer_zoo import ZooWriter, mnist_spec
    from small_transformer_zoo.store.files import LockedError
    from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

    versions = _two_versions(tmp_path)
    root = tmp_path / "live"
    write_synthetic_zoo(root, "syn", runs=8, seed=1, register=False)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_A_WRITER, str(root)], stdout=subprocess.PIPE, text=True,
                              stdin=subprocess.PIPE,
                              cwd=PROJECT, env={**os.environ, "STZ_HOME": str(stz_home)})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockedError, match=rf"syn is being written by pid {holder.pid} on .*\(ZooWriter, since"):
            write_synthetic_zoo(root, "syn", runs=8, seed=2, register=False, overwrite=True)
    finally:
        holder.kill()
        holder.wait()
    assert _which_version(read_labelled(root, "fast path"), versions) == 1
    first = ZooWriter(root, "syn", mnist_spec(), overwrite=True, register=False)
    refused: list[BaseException] = []
    other = threading.Thread(target=lambda: refused.append(pytest.raises(LockedError, ZooWriter, root, "syn",
                                                                         mnist_spec(), overwrite=True)))
    other.start()
    other.join()
    assert "another thread of this process" in str(refused[0].value)
    with pytest.raises(ValueError, match="unknown metadata fields"):
        with first:
            first.add(np.zeros(18_506, np.float32), {"run_id": "x", "epoch": 1, "test_accuracy": 0.5, "bad": 1})
    write_synthetic_zoo(root, "syn", runs=8, seed=2, register=False, overwrite=True)  # the failed writer let go
    assert _which_version(read_labelled(root, "fast path"), versions) == 2


KILL_AT_STEP = """
import os, signal, sys
from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo
step, root = int(sys.argv[1]), sys.argv[2]
count = 0
def counted(name):
    real = getattr(os, name)
    def call(*args, **kwargs):
        global count
        count += 1
        if count == step:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)
    setattr(os, name, call)
for name in ("replace", "unlink", "rmdir"):
    counted(name)
write_synthetic_zoo(root, "syn", runs=8, seed=2, register=False, overwrite=True)
print(count)
"""


@pytest.mark.slow
def test_a_writer_killed_at_any_step_leaves_the_old_zoo_or_the_new_one(tmp_path: Path, stz_home: Path) -> None:
    """A real SIGKILL before each file operation (rename, unlink, rmdir) of a replace, one process per step: the
    folder is then the old zoo or the new one, complete and verified, and a rerun leaves exactly the new one."""
    import subprocess
    import sys

    from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

    versions = _two_versions(tmp_path)
    project = PROJECT
    steps, seen, step = None, set(), 1
    while steps is None or step <= steps:
        root = tmp_path / f"kill-{step}"
        shutil.copytree(tmp_path / "v1", root)
        run = subprocess.run([sys.executable, "-c", KILL_AT_STEP, str(step), str(root)], cwd=project,
                             capture_output=True, text=True, timeout=HANG_TIMEOUT, env={**os.environ, "STZ_HOME": str(stz_home)})
        if run.returncode == 0:
            steps = step - 1 if steps is None else steps
            assert int(run.stdout.split()[-1]) < step
        else:
            assert run.returncode == -9, run.stderr
        zoo = Zoo.open(root, "syn")
        assert zoo.verify() == []
        seen.add(_which_version(read_labelled(root, "fast path"), versions))
        write_synthetic_zoo(root, "syn", runs=8, seed=2, register=False, overwrite=True)
        assert _which_version(read_labelled(root, "fast path"), versions) == 2
        listed = {f"syn/{p}" for p in manifest_files(Zoo.open(root, "syn").manifest)}
        on_disk = {str(p.relative_to(root)) for p in (root / "syn").rglob("*") if p.is_file()}
        assert on_disk == listed | {"syn/zoo.json"}, "a rerun removes the killed writer's leftovers"
        if run.returncode == 0 and steps == step - 1:
            break
        step += 1
    assert seen == {1, 2} and steps >= 8, (seen, steps)


def test_writers_never_follow_a_link_or_wait_on_a_pipe(tmp_path: Path, stz_home: Path) -> None:
    from small_transformer_zoo import ZooWriter
    from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

    outside = tmp_path / "outside"
    outside.mkdir()
    precious = outside / "precious.txt"
    precious.write_text("keep me")
    root = tmp_path / "root"
    root.mkdir()
    (root / ".syn.lock").symlink_to(precious)
    with pytest.raises(ValueError, match="the lock file is a symbolic link"):
        write_synthetic_zoo(root, "syn", runs=4, register=False)
    assert precious.read_text() == "keep me"
    (root / ".syn.lock").unlink()
    (root / "syn").mkdir()
    (outside / "train-0.parquet").write_text("not a zoo file")
    (root / "syn" / "metadata").symlink_to(outside)
    with pytest.raises(ValueError, match="metadata: is a symbolic link"):
        ZooWriter(root, "syn", mnist_spec())
    assert (outside / "train-0.parquet").exists() and precious.read_text() == "keep me"
    (root / "syn" / "metadata").unlink()
    os.mkfifo(root / "README.md")
    write_synthetic_zoo(root, "syn", runs=4, register=False)  # finishes: the FIFO is left alone, never waited on
    assert Zoo.open(root, "syn").verify() == []
    (root / "README.md").unlink()
    (root / "README.md").symlink_to("/dev/zero")
    write_synthetic_zoo(root, "other", runs=4, register=False)
    assert (root / "README.md").is_symlink()


def test_links_out_of_the_zoo_are_refused_unless_asked_for(zoo_copy: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    path = shard_file(zoo_copy / "syn", "train")
    moved = tmp_path / "elsewhere.safetensors"
    shutil.move(path, moved)
    path.symlink_to(moved)
    with pytest.raises(ZooFormatError, match="is a link to .*elsewhere.safetensors, outside the zoo"):
        Zoo.open(zoo_copy, "syn").split_weights("train")
    monkeypatch.setenv("STZ_FOLLOW_LINKS", "1")
    assert Zoo.open(zoo_copy, "syn").verify() == []
    monkeypatch.delenv("STZ_FOLLOW_LINKS")
    inside = zoo_copy / "syn" / "kept.safetensors"
    path.unlink()
    shutil.move(moved, inside)
    path.symlink_to(inside)  # a link within the zoo root is fine
    assert Zoo.open(zoo_copy, "syn").verify() == []


@pytest.mark.parametrize("fails_at", [1, 2, 4])
@pytest.mark.parametrize("earlier", [False, True], ids=["new zoo", "overwrite"])
def test_a_write_that_fails_on_a_full_disk_leaves_no_debris(tmp_path: Path, stz_home: Path, earlier: bool,
                                                             fails_at: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills at the `fails_at`-th file the writer writes: a new zoo leaves nothing (no orphan shard, no
    lock); an overwrite leaves the earlier zoo whole and nothing beside it."""
    import errno

    from small_transformer_zoo.store import writer as writer_module
    from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

    if earlier:
        write_synthetic_zoo(tmp_path, "syn", runs=10, shard_size=4, register=False)
    before = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    written = {"count": 0}
    real = writer_module.atomic_write_bytes

    def filling(path, data):
        written["count"] += 1
        if written["count"] >= fails_at:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(writer_module, "atomic_write_bytes", filling)
    with pytest.raises(OSError, match="No space left"):
        write_synthetic_zoo(tmp_path, "syn", runs=10, seed=1, shard_size=4, register=False, overwrite=earlier)
    after = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*"))
    assert after == before
    if earlier:
        assert Zoo.open(tmp_path, "syn").verify() == []
