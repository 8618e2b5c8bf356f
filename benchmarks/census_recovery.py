"""Part 6 of `reliability_census.py`: what the package does with its own state when it is damaged, raced or
refused, in seven classes of cases:

- 6a the `datasets` cache's own files: its description lies about the row count, or is garbage; its Arrow file is
  cut, emptied, deleted or replaced; each read on every verify mode;
- 6b a changed byte in the cache read with the clock an hour behind, then with the right clock;
- 6c a zoo signed by a tool without the writer's checks (NaN weights not marked diverged, one checkpoint id in two
  splits, a run with two best checkpoints), read by `stz verify`, "always" and "once", fast path and `load_dataset`;
- 6d the writers of every shared file: three Hub reviews merging at once (loopback Hub), four processes saving fits
  into a bench run while a fifth finishes it, a damaged registry met by `stz register`;
- 6e errors in DataLoader workers: a shard damaged after it was checked, a zoo gone before spawned workers start,
  an empty split;
- 6f a FIFO where a shard, the registry or a results file should be, each read in a child process with a limit;
- 6g what a failure leaves: a new zoo and an overwrite on a full disk, a results "file" that is a folder.

Outcomes: "kept" / "intact data" / "clear error" / "own kind" (the package's error across the worker boundary) are
right; "lost", "silently wrong", "raw error", "hang" and "debris" are failures, listed at the end.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch

from census_shared import print_part
from small_transformer_zoo import (WeightSpaceCollator, WeightSpaceDataset, Zoo, ZooFormatError, ZooWriter,
                                   load_dataset)
from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

MODES = ("once", "always", "never")


def _same(rows, truth: Zoo) -> bool:
    keep = truth.select("train")
    ids = truth.metadata("train").take(keep).column("checkpoint_id").to_pylist()
    data = rows.with_format("numpy")
    return list(data["checkpoint_id"]) == ids and np.array_equal(
        np.asarray(data["params"]), truth.split_weights("train").rows(keep).numpy())


def _read(pristine: Path, cache: Path, mode: str) -> str:
    try:
        rows = load_dataset(pristine, "syn", split="train", cache_dir=str(cache), verify=mode)
    except ZooFormatError:
        return "clear error"
    except Exception as exc:  # noqa: BLE001 - what the census looks for
        return f"raw error ({type(exc).__name__})"
    if _same(rows, Zoo.open(pristine, "syn")):
        return "intact data"
    return "trusted by request" if mode == "never" else "silently wrong"


def _damage_cache(cache: Path, case: str) -> None:
    info, arrow = next(cache.rglob("dataset_info.json")), next(cache.rglob("*-train.arrow"))
    if case == "description: row count":
        described = json.loads(info.read_text())
        described["splits"]["train"]["num_examples"] = 3
        info.write_text(json.dumps(described))
    elif case == "description: garbage":
        info.write_text("garbage{")
    elif case == "Arrow file cut":
        arrow.write_bytes(arrow.read_bytes()[: arrow.stat().st_size // 2])
    elif case == "Arrow file emptied":
        arrow.write_bytes(b"")
    elif case == "Arrow file deleted":
        arrow.unlink()
    elif case == "Arrow file replaced":
        table = pa.table({"x": [1, 2, 3]})
        with pa.OSFile(str(arrow), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)


def cache_metadata(pristine: Path, work: Path) -> list[tuple[str, str]]:
    out = []
    for case in ("description: row count", "description: garbage", "Arrow file cut", "Arrow file emptied",
                 "Arrow file deleted", "Arrow file replaced"):
        for mode in MODES:
            cache = work / uuid.uuid4().hex
            load_dataset(pristine, "syn", split="train", cache_dir=str(cache))
            _damage_cache(cache, case)
            out.append((f"{case}, {mode}", _read(pristine, cache, mode)))
            shutil.rmtree(cache, ignore_errors=True)
    return out


def clock_skew(pristine: Path, work: Path, trials: int = 4) -> list[tuple[str, str]]:
    out = []
    for _ in range(trials):
        cache = work / uuid.uuid4().hex
        first = load_dataset(pristine, "syn", split="train", cache_dir=str(cache))
        path = Path(first.cache_files[0]["filename"])
        raw = bytearray(path.read_bytes())
        raw[len(raw) // 2] ^= 0x04
        path.write_bytes(bytes(raw))
        real = time.time
        time.time = lambda: real() - 3600  # noqa: E731 - the reader's clock an hour behind
        try:
            out.append(("a changed byte, clock an hour behind", _read(pristine, cache, "once")))
        finally:
            time.time = real
        out.append(("then read with the right clock", _read(pristine, cache, "once")))
        shutil.rmtree(cache, ignore_errors=True)
    return out


def _resigned(work: Path, broken: str) -> tuple[Path, str]:
    """A zoo with one invariant broken, written and signed by the writer with its checks switched off."""
    from reliability_census import _edit_train_metadata

    from small_transformer_zoo.store import writer as writer_module

    checks = ("finite_unless_diverged", "new_checkpoint_id", "one_best_per_run")
    saved = {name: getattr(writer_module, name) for name in checks}
    root = work / uuid.uuid4().hex
    try:
        for name in checks:
            setattr(writer_module, name, lambda *args, **kwargs: None)
        if broken == "NaN weights not marked diverged":
            with ZooWriter(root, "bad", Zoo.open(work.parent / "pristine", "syn").spec, register=False) as writer:
                params = np.zeros(writer.spec.n_params, np.float32)
                for run in range(12):
                    row = params.copy()
                    row[5] = np.nan if run == 3 else 0.0
                    writer.add(row, {"run_id": f"r{run}", "epoch": 1, "test_accuracy": 0.5})
            zoo = Zoo.open(root, "bad")
            split = next(s for s in zoo.splits if "r3" in zoo.metadata(s).column("run_id").to_pylist())
            return root, split
        write_synthetic_zoo(root, "bad", runs=12, register=False)
    finally:
        for name, check in saved.items():
            setattr(writer_module, name, check)
    other = Zoo.open(root, "bad").metadata("test").column("checkpoint_id")[0].as_py()

    def edit(table: pa.Table) -> pa.Table:
        if broken == "two best checkpoints of a run":
            row = next(i for i, r in enumerate(table.to_pylist()) if not r["is_best"])
            best = [b or i == row for i, b in enumerate(table.column("is_best").to_pylist())]
            return table.set_column(table.schema.get_field_index("is_best"), "is_best", pa.array(best))
        ids = table.column("checkpoint_id").to_pylist()
        ids[0] = other
        return table.set_column(table.schema.get_field_index("checkpoint_id"), "checkpoint_id", pa.array(ids))

    _edit_train_metadata(edit)(root / "bad")
    return root, "train"


def writer_invariants(work: Path) -> list[tuple[str, str]]:
    out = []
    for broken in ("NaN weights not marked diverged", "one checkpoint id in two splits",
                   "two best checkpoints of a run"):
        root, split = _resigned(work, broken)
        out.append((f"{broken}, stz verify", "clear error" if Zoo.open(root, "bad").verify() else "silently wrong"))
        for mode in ("always", "once"):
            for path in ("fast path", "load_dataset"):
                try:
                    if path == "fast path":
                        Zoo.open(root, "bad", verify=mode).split_weights(split)
                    else:
                        load_dataset(str(root), "bad", split=split, cache_dir=str(root / f"cache-{mode}"), verify=mode)
                    result = "silently wrong"
                except ZooFormatError:
                    result = "clear error"
                except Exception as exc:  # noqa: BLE001
                    result = f"raw error ({type(exc).__name__})"
                out.append((f"{broken}, {mode}, {path}", result))
    return out


def shared_writers(pristine: Path, work: Path, trials: int) -> list[tuple[str, str]]:
    from nfn_baselines.bench.resume import FitStore
    from nfn_baselines.bench.submission import write_submission
    from common import start_hub
    from huggingface_hub import HfApi

    from nfn_baselines.leaderboard.hub import hub_results, review, submit

    out = []
    truth = Zoo.open(pristine, "syn").metadata("test")
    labels = np.asarray(truth.column("test_accuracy").to_pylist())
    hub = start_hub()
    try:
        for trial in range(trials):
            repo_id = f"census/board-{trial}-{uuid.uuid4().hex[:6]}"
            HfApi().create_repo(repo_id, repo_type="dataset")
            numbers = []
            for i in range(3):
                path = write_submission(work / f"{trial}-{i}.csv", truth.column("checkpoint_id").to_pylist(),
                                        np.clip(labels + 0.05 * (i + 1), 0, 1))
                numbers.append(submit(path, repo_id, pristine, "syn", "test", f"model-{i}").pr_num)
            threads = [threading.Thread(target=review, args=(repo_id, n, pristine), kwargs={"merge": True})
                       for n in numbers]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            kept = len(hub_results(repo_id, "main"))
            out.append(("three Hub reviews merging at once", "kept" if kept == 3 else f"lost {3 - kept} entries"))
    finally:
        hub.__exit__(None, None, None)
    saver = ("import sys, numpy as np; from pathlib import Path; from nfn_baselines.bench.resume import Fit, FitStore\n"
             "s = FitStore(Path(sys.argv[1]), Path(sys.argv[2]))\n"
             "for i in range(25): s.save(None, f'm{sys.argv[3]}-{i}', 'all', fits=[Fit({'test': np.zeros(3)}, {}, 0.5)],"
             " untuned=None, trials=None, seconds=1.0)\n")
    finisher = ("import sys, time; from pathlib import Path; from nfn_baselines.bench.resume import FitStore\n"
                "time.sleep(0.3); FitStore(Path(sys.argv[1]), Path(sys.argv[2])).finish()\n")
    for trial in range(trials):
        folder, kept = work / f"fits-{trial}" / ".resume" / "run", work / f"fits-{trial}" / ".fits" / "run"
        processes = [subprocess.Popen([sys.executable, "-c", saver, str(folder), str(kept), str(k)],
                                      stderr=subprocess.DEVNULL) for k in range(4)]
        processes.append(subprocess.Popen([sys.executable, "-c", finisher, str(folder), str(kept)]))
        failed = sum(p.wait() != 0 for p in processes)
        count = len(FitStore(folder, kept))
        out.append(("four savers and a finisher of one bench run",
                    "kept" if count == 100 and not failed else f"lost {100 - count} entries"))
    for label, content in (("truncated", b'{"a": ["/x"'), ("garbage", b"garbage"), ("a JSON list", b"[1, 2]"),
                           ("NUL bytes", b"\0\0\0")):
        home = work / f"home-{uuid.uuid4().hex[:6]}"
        home.mkdir()
        (home / "registry.json").write_bytes(content)
        done = subprocess.run([sys.executable, "-m", "small_transformer_zoo.cli", "register", str(pristine)],
                              env=os.environ | {"STZ_HOME": str(home)}, capture_output=True, text=True)
        untouched = (home / "registry.json").read_bytes() == content
        clear = done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1 and "registry.json" in done.stderr
        out.append((f"a damaged registry ({label}) met by stz register",
                    "kept" if untouched and clear else ("lost 1 entries" if not untouched else "raw error")))
    return out


def worker_errors(pristine: Path, work: Path) -> list[tuple[str, str]]:
    from small_transformer_zoo import ZooDamagedError, ZooNotFoundError

    out = []
    for case, start in (("a shard damaged after it was checked", "fork"),
                        ("a shard damaged after it was checked", "spawn"), ("a zoo gone before the workers", "spawn"),
                        ("an empty split", "spawn")):
        root = work / uuid.uuid4().hex
        shutil.copytree(pristine, root)
        expected: type[Exception] = ZooDamagedError
        try:
            if case == "an empty split":
                write_synthetic_zoo(root, "one", runs=1, register=False)
                zoo = Zoo.open(root, "one")
                split = next(s for s in zoo.splits if not len(zoo.metadata(s)))
                data = WeightSpaceDataset(zoo.split_weights(split), label=None)
                list(torch.utils.data.DataLoader(data, batch_size=2, num_workers=2, multiprocessing_context=start))
                out.append((f"{case}, {start}", "intact data"))
                continue
            zoo = Zoo.open(root, "syn")
            weights = zoo.split_weights("train")
            if case == "a zoo gone before the workers":
                shutil.move(str(root), str(root) + "-moved")
                expected = ZooNotFoundError
            else:
                source = weights.sources[0]
                with open(source.path, "r+b") as handle:
                    handle.seek(source.data_start)
                    byte = handle.read(1)
                    handle.seek(source.data_start)
                    handle.write(bytes([byte[0] ^ 1]))
            loader = torch.utils.data.DataLoader(WeightSpaceDataset(weights), batch_size=4, num_workers=2,
                                                 multiprocessing_context=start,
                                                 collate_fn=WeightSpaceCollator(zoo.spec))
            list(loader)
            out.append((f"{case}, {start}", "silently wrong"))
        except expected:
            out.append((f"{case}, {start}", "own kind"))
        except Exception as exc:  # noqa: BLE001
            out.append((f"{case}, {start}", f"raw error ({type(exc).__name__})"))
    return out


FIFO_READS = {
    "a shard": ("from small_transformer_zoo import Zoo; import sys; Zoo.open(sys.argv[1], 'syn')"
                ".split_weights('train')"),
    "registry.json": ("from small_transformer_zoo import load_dataset; load_dataset('small-transformer-zoo', "
                      "'syn')"),
    "results.json": ("from nfn_baselines.leaderboard.scoring import load_leaderboard; import sys; "
                     "load_leaderboard(sys.argv[2])"),
}


def non_regular_files(pristine: Path, work: Path) -> list[tuple[str, str]]:
    out = []
    for what, code in FIFO_READS.items():
        root, home = work / uuid.uuid4().hex, work / uuid.uuid4().hex
        shutil.copytree(pristine, root)
        home.mkdir()
        board = work / f"{uuid.uuid4().hex}.json"
        target = {"a shard": next((root / "syn" / "weights").glob("train-*")), "registry.json":
                  home / "registry.json", "results.json": board}[what]
        target.unlink(missing_ok=True)
        os.mkfifo(target)
        try:
            done = subprocess.run([sys.executable, "-c", code, str(root), str(board)], timeout=60,
                                  env=os.environ | {"STZ_HOME": str(home)}, capture_output=True, text=True)
            last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ""
            clear = done.returncode != 0 and ("Error: " in last) and ("regular file" in last or "FIFO" in last
                                                                      or "not a regular" in last)
            out.append((f"a FIFO as {what}", "clear error" if clear else f"raw error ({last[:60]})"))
        except subprocess.TimeoutExpired:
            out.append((f"a FIFO as {what}", "hang"))
    return out


def debris(work: Path) -> list[tuple[str, str]]:
    from nfn_baselines.leaderboard.scoring import SubmissionError, add_result
    from small_transformer_zoo.store import writer as writer_module

    out = []
    for case in ("a new zoo on a full disk", "an overwrite on a full disk"):
        for fails_at in (1, 2, 4):
            root = work / uuid.uuid4().hex
            if case.startswith("an overwrite"):
                write_synthetic_zoo(root, "syn", runs=10, shard_size=4, register=False)
            before = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else []
            real, count = writer_module.atomic_write_bytes, {"n": 0}

            def filling(path: Path, data: bytes, real: Callable = real, count: dict = count,
                        fails_at: int = fails_at) -> None:
                count["n"] += 1
                if count["n"] >= fails_at:
                    raise OSError(errno.ENOSPC, "No space left on device", str(path))
                real(path, data)

            writer_module.atomic_write_bytes = filling
            try:
                write_synthetic_zoo(root, "syn", runs=10, seed=1, shard_size=4, register=False,
                                    overwrite=case.startswith("an overwrite"))
                result = "silently wrong"
            except OSError:
                after = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")) if root.exists() else []
                result = "clear error" if after == before else f"debris ({len(set(after) - set(before))} files)"
            finally:
                writer_module.atomic_write_bytes = real
            out.append((case, result))
    folder = work / "board"
    folder.mkdir()
    with contextlib.suppress(SubmissionError):
        add_result(folder, "a", "syn", "test", {"tau": 0.1}, "census")
    left = [p.name for p in work.iterdir() if p.name.startswith(".board")]
    out.append(("a folder given as the results file", "debris" if left else "clear error"))
    return out


def run(pristine: Path, work: Path, trials: int) -> None:
    work.mkdir(parents=True, exist_ok=True)
    failures = []
    failures += print_part("Part 6a: the datasets cache's own files, per verify mode", cache_metadata(pristine, work))
    failures += print_part("Part 6b: clock skew", clock_skew(pristine, work))
    failures += print_part("Part 6c: what the writer refuses, signed by another tool", writer_invariants(work))
    failures += print_part(f"Part 6d: writers of every shared file, {trials} trials",
                           shared_writers(pristine, work, trials))
    failures += print_part("Part 6e: errors in DataLoader workers", worker_errors(pristine, work))
    failures += print_part("Part 6f: a FIFO where a file should be (each read limited to 60 s)",
                           non_regular_files(pristine, work))
    failures += print_part("Part 6g: what a failure leaves", debris(work))
    hangs = sum(line.endswith("hang") for line in failures)
    print(f"Part 6: lost, silently wrong, raw, hang or debris: {len(failures)} (hangs: {hangs})")
    for line in failures:
        print("  " + line)
