"""Loading throughput on a synthetic zoo of the MNIST architecture, with the cost of the read checks.

    python benchmarks/bench_loading.py [--runs 525]   # 525 runs x 4 checkpoints = 2,100 checkpoints

Prints, for the train split (warm page cache for every method):
  raw sequential read of the shard bytes (the limit) and the fast path (memory-mapped shards -> one tensor), as a
  fraction of it; one torch.load per .pt file (the original release layout) against the fast path; the
  `datasets` builder with with_format("torch") in batches of 256, and streaming from the loopback Hub server, with
  and without its per-row digest checks.
"""

from __future__ import annotations

import argparse
import shutil

from common import WORK, row, start_hub, timed

HUB = start_hub()

import numpy as np  # noqa: E402
import torch  # noqa: E402

from small_transformer_zoo import Zoo, load_dataset  # noqa: E402
from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo  # noqa: E402


def raw_read(paths: list) -> int:
    """The limit: each shard file read sequentially, whole, into new memory (numpy.fromfile)."""
    return sum(np.fromfile(path, dtype=np.uint8).size for path in paths)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=525)
    args = parser.parse_args()
    root = WORK / "zoo"
    manifest = write_synthetic_zoo(root, "bench", runs=args.runs, register=False)
    zoo = Zoo.open(root, "bench")
    split = "train"
    rows = zoo.manifest["counts"][split]
    paths = [zoo.dir / p for p in zoo.shard_paths(split)]
    nbytes = sum(p.stat().st_size for p in paths)
    print(f"zoo: {manifest['counts']['checkpoints']:,} checkpoints x {zoo.spec.n_params:,} params; "
          f"split '{split}': {rows:,} checkpoints in {len(paths)} shards, {nbytes / 2**20:,.1f} MiB; work dir {WORK}")
    zoo.split_weights(split)  # first load hashes the shards once and stamps them

    raw_s, _ = timed(lambda: raw_read(paths))
    fast_s, tensor = timed(lambda: zoo.split_weights(split).to_tensor())
    first_s, _ = timed(lambda: Zoo.open(root, "bench").split_weights(split, verify="always").to_tensor(), repeat=1)
    assert tensor.shape == (rows, zoo.spec.n_params)
    print("\n[1] fast path against a raw sequential read of the same bytes")
    print(row("raw read of the shard files", raw_s, nbytes / 2**20, "MiB/s"))
    print(row("fast path: split_weights().to_tensor()", fast_s, nbytes / 2**20, "MiB/s", nbytes / 2**20 / raw_s,
              "of raw read"))
    print(row("fast path with sha256 check (first load)", first_s, nbytes / 2**20, "MiB/s",
              nbytes / 2**20 / raw_s, "of raw read"))

    original = WORK / "original"
    original.mkdir(exist_ok=True)
    weights, meta = zoo.weight_space(split)
    files = []
    for index, cid in enumerate(meta.column("checkpoint_id").to_pylist()):
        path = original / f"{cid}.pt"
        torch.save(weights.state_dict(index), path)
        files.append(path)
    layout = zoo.spec.parameters()

    def load_original() -> torch.Tensor:
        out = torch.empty(len(files), zoo.spec.n_params)
        for i, path in enumerate(files):
            state = torch.load(path, map_location="cpu", weights_only=True)
            out[i] = torch.cat([state[p.name].reshape(-1) for p in layout])
        return out

    orig_s, orig_tensor = timed(load_original)
    assert torch.equal(orig_tensor, tensor)
    print("\n[2] original layout (one torch.load per .pt file) against the fast path")
    print(row("original layout, torch.load per checkpoint", orig_s, rows, "ckpt/s"))
    print(row("fast path", fast_s, rows, "ckpt/s", rows / orig_s, "vs original"))

    load_dataset(root, "bench", split=split)  # prepare the Arrow cache once

    def builder_batches() -> int:
        ds = load_dataset(root, "bench", split=split).with_format("torch")
        seen = 0
        for start in range(0, ds.num_rows, 256):
            seen += ds[start : start + 256]["params"].shape[0]
        return seen

    builder_s, seen = timed(builder_batches)
    assert seen == rows
    repo = "bench/zoo"
    HUB.add_dataset(repo, root)

    def stream(verify: str = "once") -> int:
        seen = 0
        rows_ = load_dataset(repo, "bench", split=split, streaming=True, verify=verify).with_format("torch")
        for batch in rows_.iter(256):
            seen += batch["params"].shape[0]
        return seen

    stream_s, seen = timed(stream, repeat=1)
    unchecked_s, _ = timed(lambda: stream("never"), repeat=1)
    assert seen == rows
    print("\n[3] datasets builder and Hub streaming, rows/s and ratio to the fast path")
    print(row("fast path", fast_s, rows, "rows/s"))
    print(row("datasets builder, with_format('torch'), batches of 256", builder_s, rows, "rows/s",
              rows / fast_s, "of fast path"))
    print(row("streaming from the loopback Hub (hf://), batches of 256", stream_s, rows, "rows/s",
              rows / fast_s, "of fast path"))
    print(row("the same, rows not checked (verify='never')", unchecked_s, rows, "rows/s"))
    print(f"  checked streaming runs at {unchecked_s / stream_s:.2f}x the rate of unchecked streaming")
    shutil.rmtree(original)


if __name__ == "__main__":
    main()
