"""Part 5 of `reliability_census.py`: files several processes write at once, a damaged `datasets` cache under each
verify mode, a split's weights pickled into workers that spawn, and names the store cannot hold.

Each case is counted as one outcome: "kept" (every writer's update is there), "intact data", "clear error",
"refused wrongly", "silently wrong", "raw error" (an exception that is not the package's one-line kind), "debris"
(a refusal that left files behind), or "trusted by request" (a damaged cache read with `verify="never"`, which
asks for no check).
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import random
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from nfn_baselines.bench.resume import Fit, FitStore
from nfn_baselines.leaderboard.scoring import add_result, load_leaderboard
from small_transformer_zoo import WeightSpaceCollator, WeightSpaceDataset, Zoo, ZooFormatError, ZooWriter, load_dataset
from small_transformer_zoo import mnist_spec
from small_transformer_zoo.original import import_original
from small_transformer_zoo.testing.synthetic_release import write_synthetic_release

WRITERS, EACH = 6, 5


def _start_together(target: Callable[..., None], shared: str, trial: int) -> None:
    context = multiprocessing.get_context("fork")
    start = context.Event()
    workers = [context.Process(target=target, args=(shared, w, start)) for w in range(WRITERS)]
    for worker in workers:
        worker.start()
    start.set()
    for worker in workers:
        worker.join()


def _results_writer(board: str, writer: int, start: object) -> None:
    start.wait()
    for i in range(EACH):
        add_result(board, f"m{writer}-{i}", "syn", "test", {"tau": 0.1, "r2": 0.0, "l1": 0.3}, "census")


def _registry_writer(home: str, writer: int, start: object) -> None:
    os.environ["STZ_HOME"] = home
    from small_transformer_zoo.store.local_index import register_local_zoo

    start.wait()
    for i in range(EACH):
        register_local_zoo(f"c{writer}-{i}", home)


def _resume_writer(folder: str, writer: int, start: object) -> None:
    store = FitStore(Path(folder))
    start.wait()
    for i in range(EACH):
        fit = Fit({"test": np.full(4, writer + i / 10)}, {"trial": i}, 0.5)
        store.save(None, f"m{writer}", f"c{i}", fits=[fit], untuned=None, trials=None, seconds=1.0)


def concurrent_writers(work: Path, trials: int) -> list[tuple[str, str]]:
    """Six processes at once, each adding five entries, per shared file and trial: how many entries are kept."""
    expected = WRITERS * EACH
    out = []
    for trial in range(trials):
        board = work / f"results-{trial}.json"
        _start_together(_results_writer, str(board), trial)
        kept = len(load_leaderboard(board))
        out.append(("leaderboard results", "kept" if kept == expected else f"lost {expected - kept} entries"))

        home = work / f"home-{trial}"
        _start_together(_registry_writer, str(home), trial)
        os.environ["STZ_HOME"] = str(home)
        from small_transformer_zoo.store.local_index import _read

        kept = len(_read())
        out.append(("registry of local zoos", "kept" if kept == expected else f"lost {expected - kept} entries"))

        folder = work / f"resume-{trial}"
        _start_together(_resume_writer, str(folder), trial)
        store = FitStore(folder)
        kept = sum(store.load(None, f"m{w}", f"c{i}", {"test": 4}, 1) is not None
                   for w in range(WRITERS) for i in range(EACH))
        out.append(("bench resume records", "kept" if kept == expected else f"lost {expected - kept} entries"))
    return out


def cache_damage(pristine: Path, work: Path, flips: int, seed: int) -> list[tuple[str, str]]:
    """One flipped bit at a random place of the cached Arrow file of the train split, read back on each mode; and
    an undamaged zoo with unknown values read on each mode from a fresh and a warm cache."""
    rng = random.Random(seed)
    truth = Zoo.open(pristine, "syn")
    keep = truth.select("train")
    ids = truth.metadata("train").take(keep).column("checkpoint_id").to_pylist()
    weights = dict(zip(ids, truth.split_weights("train").rows(keep)))
    out = []
    for mode in ("once", "always", "never"):
        for _ in range(2):
            cache = work / uuid.uuid4().hex
            try:
                load_dataset(pristine, "syn", split="train", cache_dir=str(cache), verify=mode)
                out.append((f"undamaged, verify={mode}", "intact data"))
            except Exception as exc:  # noqa: BLE001 - what the census looks for
                out.append((f"undamaged, verify={mode}", f"refused wrongly ({type(exc).__name__})"))
            shutil.rmtree(cache, ignore_errors=True)
        for _ in range(flips):
            cache = work / uuid.uuid4().hex
            first = load_dataset(pristine, "syn", split="train", cache_dir=str(cache), verify=mode)
            path = Path(first.cache_files[0]["filename"])
            del first
            raw = bytearray(path.read_bytes())
            at = rng.randrange(len(raw))
            raw[at] ^= 1 << rng.randrange(8)
            path.write_bytes(bytes(raw))
            out.append((f"damaged, verify={mode}", _read_back(pristine, cache, mode, weights)))
            shutil.rmtree(cache, ignore_errors=True)
    return out


def _read_back(pristine: Path, cache: Path, mode: str, weights: dict[str, torch.Tensor]) -> str:
    try:
        rows = load_dataset(pristine, "syn", split="train", cache_dir=str(cache), verify=mode).with_format("torch")
        same = len(rows) == len(weights) and all(
            r["checkpoint_id"] in weights and torch.equal(r["params"], weights[r["checkpoint_id"]]) for r in rows)
    except ZooFormatError:
        return "clear error"
    except Exception as exc:  # noqa: BLE001 - a damaged Arrow file may not parse: `datasets`' own error
        return f"raw error ({type(exc).__name__})"
    if same:
        return "intact data"
    return "trusted by request" if mode == "never" else "silently wrong"


def spawned_workers(pristine: Path) -> list[tuple[str, str]]:
    """A DataLoader with two workers per start method, over the fast path and over `load_dataset`."""
    out = []
    zoo = Zoo.open(pristine, "syn")
    weights = zoo.split_weights("train")
    expected = weights.labels()
    for start in ("fork", "forkserver", "spawn"):
        try:
            loader = torch.utils.data.DataLoader(WeightSpaceDataset(weights), batch_size=8, num_workers=2,
                                                 multiprocessing_context=start,
                                                 collate_fn=WeightSpaceCollator(zoo.spec))
            got = torch.cat([b.labels for b in loader])
            out.append((f"fast path, {start}", "intact data" if torch.equal(got, expected) else "silently wrong"))
        except Exception as exc:  # noqa: BLE001
            out.append((f"fast path, {start}", f"raw error ({type(exc).__name__})"))
        try:
            rows = load_dataset(pristine, "syn", split="train").with_format("torch")
            loader = torch.utils.data.DataLoader(rows, batch_size=8, num_workers=2, multiprocessing_context=start)
            count = sum(len(b["checkpoint_id"]) for b in loader)
            out.append((f"load_dataset, {start}", "intact data" if count == len(rows) else "silently wrong"))
        except Exception as exc:  # noqa: BLE001
            out.append((f"load_dataset, {start}", f"raw error ({type(exc).__name__})"))
    return out


BAD_NAMES = {"non-ASCII": "zöo", "250 characters": "z" * 250, "space": "a b", "hidden": ".zoo", "slash": "a/b",
             "empty": "", "leading dash": "-zoo", "CJK": "動物園"}


def unholdable_names(work: Path) -> list[tuple[str, str]]:
    """Each name on the writer and the importer: a one-line refusal with nothing left behind."""
    release = write_synthetic_release(work / "release", runs=2)
    out = []
    for label, name in BAD_NAMES.items():
        for writer in ("ZooWriter", "import-original"):
            root = work / uuid.uuid4().hex
            try:
                if writer == "ZooWriter":
                    ZooWriter(root, name, mnist_spec()).close()
                else:
                    import_original(release.top, root, name)
                result = "silently wrong (accepted)"
            except ValueError as exc:
                one_line = len(str(exc).splitlines()) == 1 and "a new zoo's name" in str(exc)
                left = root.exists() and any(root.iterdir())
                result = "debris" if left else ("clear error" if one_line else "raw error")
            except Exception as exc:  # noqa: BLE001
                result = f"raw error ({type(exc).__name__})"
            out.append((f"{writer}, {label}", result))
            shutil.rmtree(root, ignore_errors=True)
    return out


def print_part(title: str, cases: list[tuple[str, str]]) -> list[str]:
    """Counts per case kind and outcome; returns the cases whose outcome is a failure."""
    by_case: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for case, result in cases:
        by_case[case][result] += 1
    print(title)
    for case, counts in by_case.items():
        print(f"  {case:<36} " + ", ".join(f"{n} {r}" for r, n in sorted(counts.items())))
    bad = ("lost", "silently wrong", "raw error", "refused wrongly", "debris")
    return [f"{case}: {result}" for case, result in cases if result.startswith(bad)]


def run(pristine: Path, work: Path, flips: int, trials: int, seed: int) -> None:
    failures = []
    failures += print_part(f"Part 5a: {WRITERS} writers at once, {EACH} entries each, {trials} trials",
                           concurrent_writers(work, trials))
    failures += print_part(f"Part 5b: the datasets cache, {flips} flipped bits per verify mode",
                           cache_damage(pristine, work, flips, seed))
    failures += print_part("Part 5c: DataLoader workers per start method", spawned_workers(pristine))
    failures += print_part("Part 5d: names the store cannot hold", unholdable_names(work))
    print(f"Part 5: lost, silently wrong, raw, refused wrongly or debris: {len(failures)}")
    for line in failures:
        print("  " + line)
