"""A census of damage: what each read path returns for a zoo damaged at random, or edited to look consistent.

    python benchmarks/reliability_census.py [--flips 1000] [--seed 0] [--parts 1 2 3 4 5]

Part 1 flips one bit at a random place of a random file that a read of the train split uses (the manifest, the
train metadata, one of the train shards). Part 2 replaces each field of the manifest, in turn, by each of a list of
wrong values (null, negative, text, lists, objects, huge numbers, a path out of the zoo). Each case reads a fresh
copy of an intact synthetic zoo on one read path (the fast path, `load_dataset`, streaming), with its own `datasets`
cache and verification stamps. A read must return exactly the intact weights, labels and checkpoint ids of the
train split, or raise a ZooFormatError; the tables count the outcomes, and any other outcome is listed.

Part 3 makes the edits a tool that writes consistent but wrong zoos would: the damaged file's size and sha256
rewritten into the manifest (row digests swapped, a row pointer doubled, rows out of order, nulls, floats and text
where the schema has none, a shard damaged in place or claiming 2^40 rows, a file listed twice, fractions of NaN, a
NUL in a path, a shard or manifest that is a link out of the zoo, a FIFO where a shard should be), and filters of
the wrong type; each on the three read paths and `stz verify`. Part 4 runs the attacks on writers, the importer and
the leaderboard (links, FIFOs, tensors of other types, a zip bomb, a changed source, paths with spaces, constant
predictions, a public split, inputs that decode to gigabytes): each must be refused with a clear error, or done
without harm; anything else is listed. Part 5 (`census_shared.py`): concurrent writers of every shared file, a
damaged `datasets` cache under each verify mode, a split's weights in DataLoader workers per start method, and
names the store cannot hold. Part 6 (`census_recovery.py`): the `datasets` cache's own files damaged, clock skew,
zoos signed by a tool without the writer's checks, the writers of every shared file (Hub reviews, bench runs, the
registry), errors in DataLoader workers, FIFOs where files should be, and what a failure leaves behind.
"""

from __future__ import annotations

import argparse
import collections
import copy
import hashlib
import json
import os
import struct
import logging
import random
import shutil
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from common import WORK
from tqdm import tqdm

from small_transformer_zoo import Zoo, ZooFormatError, load_dataset
from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo

PATHS = ("fast path", "load_dataset", "streaming")
CONSISTENT_PATHS = (*PATHS, "stz verify")
WRONG_VALUES = [None, -1, 0, True, 1e308, 10**40, "x", "../../etc/passwd", [], [1, 2], {}, {"a": 1}]


def read_train(root: Path, path: str, where: dict | None = None) -> tuple[torch.Tensor, np.ndarray, list]:
    """Weights, test accuracies and checkpoint ids of the train split (the rows `where` picks), read on one
    path."""
    if path == "fast path":
        zoo = Zoo.open(root, "syn")
        weights = zoo.split_weights("train")
        keep = zoo.select("train", where=where)
        table = weights.metadata.take(keep)
        return (weights.rows(keep), table.column("test_accuracy").to_numpy(zero_copy_only=False),
                table.column("checkpoint_id").to_pylist())
    rows = load_dataset(str(root), "syn", split="train", streaming=path == "streaming",
                        cache_dir=str(root.parent / "datasets-cache"), where=where)
    rows = list(rows.with_format("torch"))
    return (torch.stack([r["params"] for r in rows]), torch.stack([r["test_accuracy"] for r in rows]).numpy(),
            [r["checkpoint_id"] for r in rows])


def outcome(root: Path, path: str, intact: tuple, where: dict | None = None) -> str:
    try:
        if path == "stz verify":
            return "clear error" if Zoo.open(root, "syn").verify() else "intact data"
        got = read_train(root, path, where)
    except ZooFormatError:
        return "clear error"
    except ValueError as exc:
        return "clear error" if where is not None and "where[" in str(exc) else \
            f"other error (ValueError: {' '.join(str(exc).split())[:100]})"
    except Exception as exc:  # noqa: BLE001 - any other outcome is what this census looks for
        return f"other error ({type(exc).__name__}: {' '.join(str(exc).split())[:100]})"
    same = (torch.equal(got[0], intact[0]) and got[2] == intact[2]  # labels in the precision read back
            and np.array_equal(got[1], intact[1].astype(got[1].dtype)))
    return "intact data" if same else "silently wrong"


def run_case(pristine: Path, path: str, damage: Callable[[Path], str], intact: tuple,
             where: dict | None = None) -> tuple[str, str]:
    """Damage a fresh copy of the zoo, read it on `path`; returns (what was damaged, outcome)."""
    work = WORK / uuid.uuid4().hex
    shutil.copytree(pristine, work / "zoo", symlinks=True)
    try:
        what = damage(work / "zoo" / "syn")
        return what, outcome(work / "zoo", path, intact, where)
    finally:
        shutil.rmtree(work)


def flip_a_bit(rng: random.Random) -> Callable[[Path], str]:
    def damage(config_dir: Path) -> str:
        zoo = Zoo.open(config_dir)
        files = [config_dir / "zoo.json", config_dir / zoo.manifest["metadata"]["train"]["path"],
                 *(config_dir / s["path"] for s in zoo.manifest["shards"] if s["split"] == "train")]
        target = rng.choice(files)
        data = bytearray(target.read_bytes())
        data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        target.write_bytes(bytes(data))
        return "manifest" if target.name == "zoo.json" else "metadata" if target.suffix == ".parquet" else "shard"
    return damage


def manifest_fields(value: Any, prefix: tuple = ()) -> Iterator[tuple]:
    """Paths of the manifest's fields (the first two entries of each list, the first two parameters)."""
    if prefix:
        yield prefix
    if isinstance(value, dict):
        for key, child in value.items():
            yield from manifest_fields(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value[:2]):
            yield from manifest_fields(child, (*prefix, index))


def replace_field(field: tuple, wrong: Any) -> Callable[[Path], str]:
    def damage(config_dir: Path) -> str:
        manifest = json.loads((config_dir / "zoo.json").read_text())
        node = manifest
        for key in field[:-1]:
            node = node[key]
        node[field[-1]] = copy.deepcopy(wrong)
        (config_dir / "zoo.json").write_text(json.dumps(manifest))
        return "/".join(map(str, field))
    return damage


def _manifest(config_dir: Path) -> dict:
    return json.loads((config_dir / "zoo.json").read_text())


def _save_manifest(config_dir: Path, manifest: dict) -> None:
    (config_dir / "zoo.json").write_text(json.dumps(manifest))


def _rehash(config_dir: Path, relpath: str) -> None:
    """Give the manifest a file's new size and sha256, as a tool writing a consistent but wrong zoo would."""
    manifest = _manifest(config_dir)
    data = (config_dir / relpath).read_bytes()
    for info in [*manifest["metadata"].values(), *manifest["shards"]]:
        if info["path"] == relpath:
            info["bytes"], info["sha256"] = len(data), hashlib.sha256(data).hexdigest()
    _save_manifest(config_dir, manifest)


def _edit_train_metadata(change: Callable[[pa.Table], pa.Table]) -> Callable[[Path], str]:
    def damage(config_dir: Path) -> str:
        relpath = _manifest(config_dir)["metadata"]["train"]["path"]
        pq.write_table(change(pq.read_table(config_dir / relpath)), config_dir / relpath)
        _rehash(config_dir, relpath)
        return "metadata"
    return damage


def _column(name: str, values: Callable[[list], list], kind: pa.DataType | None = None
            ) -> Callable[[pa.Table], pa.Table]:
    def change(table: pa.Table) -> pa.Table:
        new = pa.array(values(table.column(name).to_pylist()), kind)
        return table.set_column(table.schema.get_field_index(name), pa.field(name, new.type), new)
    return change


def _swap_first_two(values: list) -> list:
    return [values[1], values[0], *values[2:]]


def _train_shard(config_dir: Path) -> str:
    return next(s["path"] for s in _manifest(config_dir)["shards"] if s["split"] == "train")


def _shard_in_place(config_dir: Path) -> str:
    relpath = _train_shard(config_dir)
    data = bytearray((config_dir / relpath).read_bytes())
    data[-5] ^= 0x40
    (config_dir / relpath).write_bytes(bytes(data))
    _rehash(config_dir, relpath)
    return "shard"


def _huge_header(config_dir: Path) -> str:
    relpath = _train_shard(config_dir)
    data = (config_dir / relpath).read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + length])
    header["params"]["shape"][0] = 2**40
    text = json.dumps(header, separators=(",", ":")).encode()
    (config_dir / relpath).write_bytes(struct.pack("<Q", len(text)) + text + data[8 + length :])
    _rehash(config_dir, relpath)
    return "shard"


def _manifest_edit(change: Callable[[dict], None]) -> Callable[[Path], str]:
    def damage(config_dir: Path) -> str:
        manifest = _manifest(config_dir)
        change(manifest)
        _save_manifest(config_dir, manifest)
        return "manifest"
    return damage


def _link_out(which: str) -> Callable[[Path], str]:
    def damage(config_dir: Path) -> str:
        relpath = "zoo.json" if which == "manifest" else _train_shard(config_dir)
        outside = config_dir.parent.parent / f"outside-{uuid.uuid4().hex[:6]}"
        shutil.move(config_dir / relpath, outside)
        (config_dir / relpath).symlink_to(outside)
        return "link"
    return damage


def _fifo_shard(config_dir: Path) -> str:
    relpath = _train_shard(config_dir)
    (config_dir / relpath).unlink()
    os.mkfifo(config_dir / relpath)
    return "FIFO"


CONSISTENT_EDITS = {
    "row digests of two rows swapped": _edit_train_metadata(_column("params_digest", _swap_first_two)),
    "a row pointer doubled": _edit_train_metadata(_column("row", lambda v: [v[0], v[0], *v[2:]], pa.int64())),
    "rows out of storage order": _edit_train_metadata(lambda t: t.take(pa.array([1, 0, *range(2, t.num_rows)]))),
    "nulls in run_id": _edit_train_metadata(_column("run_id", lambda v: [None] * len(v), pa.string())),
    "a float row": _edit_train_metadata(_column("row", lambda v: [r + 0.5 for r in v])),
    "text in learning_rate": _edit_train_metadata(_column("learning_rate", lambda v: ["fast"] * len(v))),
    "digests removed": _edit_train_metadata(lambda t: t.drop_columns(["params_digest"])),
    "shard damaged in place": _shard_in_place,
    "a header of 2^40 rows": _huge_header,
    "a shard listed twice": _manifest_edit(lambda m: m["shards"].append(m["shards"][0])),
    "fractions of NaN": _manifest_edit(lambda m: m["splits"].update(
        fractions={"train": float("nan"), "validation": float("nan"), "test": float("nan")})),
    "a NUL in a path": _manifest_edit(lambda m: m["shards"][0].update(path=m["shards"][0]["path"] + "\x00")),
    "a shard linked out of the zoo": _link_out("shard"),
    "zoo.json linked out of the zoo": _link_out("manifest"),
    "a FIFO where a shard should be": _fifo_shard,
}
BAD_FILTERS = {"epoch=1.5": {"epoch": 1.5}, "epoch=(1.5, None)": {"epoch": (1.5, None)}, "epoch='1'": {"epoch": "1"},
               "is_best=1": {"is_best": 1}, "optimizer=3": {"optimizer": 3}}


def print_table(title: str, counts: collections.Counter, rows: list[str], listed: list[str],
                paths: tuple[str, ...] = PATHS) -> None:
    print(title)
    width = max(12, *(len(r) + 2 for r in rows))
    print(f"{'':<{width}}{'read path':<14}{'clear error':>12}{'intact data':>13}{'silently wrong':>16}{'other':>7}")
    for row in rows:
        for path in paths:
            found = {o: n for (r, p, o), n in counts.items() if r == row and p == path}
            if not found:
                continue
            other = sum(n for o, n in found.items() if o.startswith("other"))
            print(f"{row:<{width}}{path:<14}{found.get('clear error', 0):>12}{found.get('intact data', 0):>13}"
                  f"{found.get('silently wrong', 0):>16}{other:>7}")
    print(f"silently wrong or another error: {len(listed)}")
    for line in listed:
        print("  " + line)
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flips", type=int, default=1000, help="cases of part 1, one flipped bit each "
                                                                "(default: 1000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the places and bits (default: 0)")
    parser.add_argument("--parts", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6], choices=range(1, 7),
                        help="which parts to run (default: all)")
    parser.add_argument("--cache-flips", type=int, default=20,
                        help="part 5: flipped bits in the datasets cache per verify mode (default: 20)")
    parser.add_argument("--trials", type=int, default=4, help="part 5: trials of concurrent writers (default: 4)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    pristine = WORK / "pristine"
    write_synthetic_zoo(pristine, "syn", runs=24, shard_size=10, register=False)
    intact = read_train(pristine, "fast path")

    if 1 in args.parts:
        rng, counts, listed = random.Random(args.seed), collections.Counter(), []
        for case in tqdm(range(args.flips), desc="part 1: flipped bits", unit="case"):
            path = PATHS[case % len(PATHS)]
            what, result = run_case(pristine, path, flip_a_bit(rng), intact)
            counts[(what, path, result)] += 1
            if result not in ("intact data", "clear error"):
                listed.append(f"{what}, {path}: {result}")
        print_table(f"Part 1: {args.flips} cases (seed {args.seed}), one flipped bit each", counts,
                    ["manifest", "metadata", "shard"], listed)

    if 2 in args.parts:
        manifest = json.loads((pristine / "syn" / "zoo.json").read_text())
        fields = list(manifest_fields(manifest))
        counts, listed = collections.Counter(), []
        cases = [(f, w) for f in fields for w in WRONG_VALUES]
        for index, (field, wrong) in enumerate(tqdm(cases, desc="part 2: wrong manifest values", unit="case")):
            path = PATHS[index % len(PATHS)]
            what, result = run_case(pristine, path, replace_field(field, wrong), intact)
            counts[("manifest", path, result)] += 1
            if result not in ("intact data", "clear error"):
                listed.append(f"{what} = {wrong!r}, {path}: {result}")
        print_table(f"Part 2: {len(fields)} manifest fields x {len(WRONG_VALUES)} wrong values", counts, ["manifest"],
                    listed)

    if 3 in args.parts:
        counts, listed = collections.Counter(), []
        cases = [(name, damage, None) for name, damage in CONSISTENT_EDITS.items()]
        cases += [(f"where {name}", lambda config_dir: "filter", where) for name, where in BAD_FILTERS.items()]
        for name, damage, where in tqdm(cases, desc="part 3: consistent edits and bad filters", unit="edit"):
            for path in CONSISTENT_PATHS if where is None else PATHS:
                _, result = run_case(pristine, path, damage, intact, where)
                counts[(name, path, result)] += 1
                if result not in ("clear error",):
                    listed.append(f"{name}, {path}: {result}")
        print_table(f"Part 3: {len(CONSISTENT_EDITS)} consistent but wrong edits (on {len(CONSISTENT_PATHS)} paths) and "
                    f"{len(BAD_FILTERS)} filters of the wrong type (on {len(PATHS)} paths)", counts, [c[0] for c in cases],
                    listed, CONSISTENT_PATHS)

    if 4 in args.parts:
        from census_attacks import ATTACKS

        results = collections.Counter()
        listed = []
        for name, attack in tqdm(ATTACKS.items(), desc="part 4: writers, importer, leaderboard", unit="attack"):
            work = WORK / uuid.uuid4().hex
            work.mkdir()
            try:
                result = attack(work, pristine)
            except Exception as exc:  # noqa: BLE001 - what this census looks for
                result = f"other ({type(exc).__name__}: {' '.join(str(exc).split())[:100]})"
            finally:
                shutil.rmtree(work, ignore_errors=True)
            kind = next((k for k in ("refused, clear error", "done, no harm") if result.startswith(k)), "other")
            results[kind] += 1
            print(f"  {name:<74} {result}")
            if kind == "other":
                listed.append(f"{name}: {result}")
        print(f"Part 4: {len(ATTACKS)} attacks: " + ", ".join(f"{n} {r}" for r, n in sorted(results.items())))
        print(f"harmful, silently wrong or another error: {len(listed)}")
        for line in listed:
            print("  " + line)

    if 5 in args.parts:
        from census_shared import run

        run(pristine, WORK / "part5", args.cache_flips, args.trials, args.seed)

    if 6 in args.parts:
        from census_recovery import run as run_recovery

        run_recovery(pristine, WORK / "part6", args.trials)


if __name__ == "__main__":
    main()
