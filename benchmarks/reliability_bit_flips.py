"""A census of damage: one bit flipped at a random place of a random file a read of the train split uses.

    python benchmarks/reliability_bit_flips.py [--cases 300] [--seed 0]

Each case copies an intact synthetic zoo, flips one bit of its manifest, its train metadata or one of its train
shards, and reads the train split on one of three paths (the fast path, `load_dataset`, streaming), each with
its own `datasets` cache and verification stamps. A read must return exactly the intact weights, labels and
checkpoint ids, or raise a ZooFormatError; the table counts the outcomes, and any other outcome is listed.
"""

from __future__ import annotations

import argparse
import collections
import random
import shutil
import uuid
import warnings

import numpy as np
import torch
from common import WORK

from small_transformer_zoo import Zoo, ZooFormatError, load_dataset
from small_transformer_zoo.synthetic import write_synthetic_zoo

PATHS = ("fast path", "load_dataset", "streaming")


def read_train(root, path: str) -> tuple[torch.Tensor, np.ndarray, list]:
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


def train_files(config_dir) -> list:
    zoo = Zoo.open(config_dir)
    return [config_dir / "zoo.json", config_dir / zoo.manifest["metadata"]["train"]["path"],
            *(config_dir / s["path"] for s in zoo.manifest["shards"] if s["split"] == "train")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=300, help="damaged copies to read (default: 300)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the places and bits (default: 0)")
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    pristine = WORK / "pristine"
    write_synthetic_zoo(pristine, "syn", runs=24, shard_size=10, register=False)
    intact = read_train(pristine, "fast path")
    rng, counts, wrong = random.Random(args.seed), collections.Counter(), []
    for case in range(args.cases):
        path = PATHS[case % len(PATHS)]
        work = WORK / uuid.uuid4().hex
        shutil.copytree(pristine, work / "zoo")
        files = train_files(work / "zoo" / "syn")
        target = rng.choice(files)
        data = bytearray(target.read_bytes())
        where, bit = rng.randrange(len(data)), rng.randrange(8)
        data[where] ^= 1 << bit
        target.write_bytes(bytes(data))
        kind = "manifest" if target.name == "zoo.json" else "metadata" if target.suffix == ".parquet" else "shard"
        try:
            got = read_train(work / "zoo", path)
            same = (torch.equal(got[0], intact[0]) and got[2] == intact[2]  # labels in the precision read back
                    and np.array_equal(got[1], intact[1].astype(got[1].dtype)))
            outcome = "intact data" if same else "silently wrong"
        except ZooFormatError:
            outcome = "clear error"
        except Exception as exc:  # noqa: BLE001 - any other outcome is what this census looks for
            outcome = f"other error ({type(exc).__name__})"
        counts[(kind, path, outcome)] += 1
        if outcome not in ("intact data", "clear error"):
            wrong.append(f"{target.name} byte {where} bit {bit}, {path}: {outcome}")
        shutil.rmtree(work)
    print(f"{args.cases} cases (seed {args.seed}), one flipped bit each\n")
    print(f"{'file':<10}{'read path':<14}{'clear error':>12}{'intact data':>13}{'silently wrong':>16}{'other':>7}")
    for kind in ("manifest", "metadata", "shard"):
        for path in PATHS:
            row = {o: n for (k, p, o), n in counts.items() if k == kind and p == path}
            other = sum(n for o, n in row.items() if o.startswith("other"))
            print(f"{kind:<10}{path:<14}{row.get('clear error', 0):>12}{row.get('intact data', 0):>13}"
                  f"{row.get('silently wrong', 0):>16}{other:>7}")
    print(f"\nsilently wrong or another error: {len(wrong)}")
    for line in wrong:
        print("  " + line)


if __name__ == "__main__":
    main()
