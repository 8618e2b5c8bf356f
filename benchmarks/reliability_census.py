"""A census of damage: what each read path returns for a zoo damaged at random.

    python benchmarks/reliability_census.py [--flips 1000] [--seed 0]

Part 1 flips one bit at a random place of a random file that a read of the train split uses (the manifest, the
train metadata, one of the train shards). Part 2 replaces each field of the manifest, in turn, by each of a list of
wrong values (null, negative, text, lists, objects, huge numbers, a path out of the zoo). Each case reads a fresh
copy of an intact synthetic zoo on one read path (the fast path, `load_dataset`, streaming), with its own `datasets`
cache and verification stamps. A read must return exactly the intact weights, labels and checkpoint ids of the
train split, or raise a ZooFormatError; the tables count the outcomes, and any other outcome is listed.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import logging
import random
import shutil
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from common import WORK
from tqdm import tqdm

from small_transformer_zoo import Zoo, ZooFormatError, load_dataset
from small_transformer_zoo.store.synthetic_zoo import write_synthetic_zoo

PATHS = ("fast path", "load_dataset", "streaming")
WRONG_VALUES = [None, -1, 0, True, 1e308, 10**40, "x", "../../etc/passwd", [], [1, 2], {}, {"a": 1}]


def read_train(root: Path, path: str) -> tuple[torch.Tensor, np.ndarray, list]:
    """Weights, test accuracies and checkpoint ids of the train split, read on one path."""
    if path == "fast path":
        weights = Zoo.open(root, "syn").split_weights("train")
        table = weights.metadata
        return (weights.to_tensor(), table.column("test_accuracy").to_numpy(zero_copy_only=False),
                table.column("checkpoint_id").to_pylist())
    rows = load_dataset(str(root), "syn", split="train", streaming=path == "streaming",
                        cache_dir=str(root.parent / "datasets-cache"))
    rows = list(rows.with_format("torch"))
    return (torch.stack([r["params"] for r in rows]), torch.stack([r["test_accuracy"] for r in rows]).numpy(),
            [r["checkpoint_id"] for r in rows])


def outcome(root: Path, path: str, intact: tuple) -> str:
    try:
        got = read_train(root, path)
    except ZooFormatError:
        return "clear error"
    except Exception as exc:  # noqa: BLE001 - any other outcome is what this census looks for
        return f"other error ({type(exc).__name__}: {' '.join(str(exc).split())[:100]})"
    same = (torch.equal(got[0], intact[0]) and got[2] == intact[2]  # labels in the precision read back
            and np.array_equal(got[1], intact[1].astype(got[1].dtype)))
    return "intact data" if same else "silently wrong"


def run_case(pristine: Path, path: str, damage: Callable[[Path], str], intact: tuple) -> tuple[str, str]:
    """Damage a fresh copy of the zoo, read it on `path`; returns (what was damaged, outcome)."""
    work = WORK / uuid.uuid4().hex
    shutil.copytree(pristine, work / "zoo")
    try:
        what = damage(work / "zoo" / "syn")
        return what, outcome(work / "zoo", path, intact)
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


def print_table(title: str, counts: collections.Counter, rows: list[str], listed: list[str]) -> None:
    print(title)
    print(f"{'':<12}{'read path':<14}{'clear error':>12}{'intact data':>13}{'silently wrong':>16}{'other':>7}")
    for row in rows:
        for path in PATHS:
            found = {o: n for (r, p, o), n in counts.items() if r == row and p == path}
            if not found:
                continue
            other = sum(n for o, n in found.items() if o.startswith("other"))
            print(f"{row:<12}{path:<14}{found.get('clear error', 0):>12}{found.get('intact data', 0):>13}"
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
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    pristine = WORK / "pristine"
    write_synthetic_zoo(pristine, "syn", runs=24, shard_size=10, register=False)
    intact = read_train(pristine, "fast path")

    rng, counts, listed = random.Random(args.seed), collections.Counter(), []
    for case in tqdm(range(args.flips), desc="part 1: flipped bits", unit="case"):
        path = PATHS[case % len(PATHS)]
        what, result = run_case(pristine, path, flip_a_bit(rng), intact)
        counts[(what, path, result)] += 1
        if result not in ("intact data", "clear error"):
            listed.append(f"{what}, {path}: {result}")
    print_table(f"Part 1: {args.flips} cases (seed {args.seed}), one flipped bit each", counts,
                ["manifest", "metadata", "shard"], listed)

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


if __name__ == "__main__":
    main()
