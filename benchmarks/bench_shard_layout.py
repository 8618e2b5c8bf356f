"""Why shards are packed `[rows, n_params]` rather than one stacked tensor per parameter name (docs/design.md section 5).

    python benchmarks/bench_shard_layout.py [--rows 2048]

Writes the same checkpoints both ways and measures (a) fetching one checkpoint from the loopback Hub with HTTP
range reads (what a streaming user or a remote random-access reader pays) and (b) loading the whole shard
locally into one [rows, n_params] tensor.
"""

from __future__ import annotations

import argparse
import json
import statistics
import struct
import time

from common import WORK, row, start_hub, timed

HUB = start_hub()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from huggingface_hub import HfFileSystem  # noqa: E402
from safetensors import safe_open  # noqa: E402
from safetensors.numpy import save_file  # noqa: E402

from small_transformer_zoo import mnist_spec  # noqa: E402
from small_transformer_zoo.format.shards import encode_shard, memmap_shard, open_header  # noqa: E402


def header_of(fs: HfFileSystem, path: str) -> tuple[int, dict]:
    prefix = fs.cat_file(path, start=0, end=8)
    (length,) = struct.unpack("<Q", prefix)
    return 8 + length, json.loads(fs.cat_file(path, start=8, end=8 + length))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2048)
    parser.add_argument("--picks", type=int, default=20)
    args = parser.parse_args()
    spec = mnist_spec()
    layout = spec.parameters()
    params = np.random.default_rng(0).normal(size=(args.rows, spec.n_params)).astype(np.float32)
    folder = WORK / "layout"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "packed.safetensors").write_bytes(encode_shard(params, layout, "bench"))
    # safetensors (0.8) writes the raw buffer of a non-contiguous numpy view, so copy each slice first.
    stacked = {p.name: np.ascontiguousarray(params[:, p.offset : p.offset + p.numel]).reshape(args.rows, *p.shape)
               for p in layout}
    save_file(stacked, str(folder / "stacked.safetensors"))
    HUB.add_dataset("bench/layout", folder)
    fs = HfFileSystem()
    base = "datasets/bench/layout"
    picks = np.random.default_rng(1).integers(0, args.rows, args.picks)

    def fetch_packed(i: int, start: int, header: dict) -> np.ndarray:
        begin = start + header["params"]["data_offsets"][0] + i * spec.n_params * 4
        return np.frombuffer(fs.cat_file(f"{base}/packed.safetensors", start=begin, end=begin + spec.n_params * 4),
                             np.float32)

    def fetch_stacked(i: int, start: int, header: dict) -> np.ndarray:
        parts = []
        for p in layout:
            begin = start + header[p.name]["data_offsets"][0] + i * p.numel * 4
            parts.append(np.frombuffer(fs.cat_file(f"{base}/stacked.safetensors", start=begin,
                                                   end=begin + p.numel * 4), np.float32))
        return np.concatenate(parts)

    print(f"{args.rows:,} checkpoints of {spec.n_params:,} params; {len(layout)} tensors per checkpoint\n")
    print("[a] one checkpoint from the loopback Hub by HTTP range reads (median of "
          f"{args.picks} random checkpoints, header already read)")
    results = {}
    for name, fetch in (("packed", fetch_packed), ("stacked", fetch_stacked)):
        start, header = header_of(fs, f"{base}/{name}.safetensors")
        before = len(HUB.requests)
        times = []
        for i in picks:
            t0 = time.perf_counter()
            got = fetch(int(i), start, header)
            times.append(time.perf_counter() - t0)
            assert np.array_equal(got, params[i])
        requests = (len(HUB.requests) - before) / len(picks)
        results[name] = statistics.median(times)
        print(f"  {name:<8} {results[name] * 1e3:8.2f} ms per checkpoint, {requests:4.0f} HTTP requests each")
    print(f"  packed is {results['stacked'] / results['packed']:.1f}x faster per remote checkpoint")

    print("\n[b] whole shard locally into one owned [rows, n_params] tensor (warm page cache)")

    def load_packed() -> torch.Tensor:
        path = folder / "packed.safetensors"
        return memmap_shard(path, open_header(path)).clone()

    def load_stacked() -> torch.Tensor:
        with safe_open(str(folder / "stacked.safetensors"), "pt") as handle:
            return torch.cat([handle.get_tensor(p.name).reshape(args.rows, -1) for p in layout], dim=1)

    packed_s, a = timed(load_packed)
    stacked_s, b = timed(load_stacked)
    assert torch.equal(a, b)
    print(row("stacked per name, then concatenated", stacked_s, args.rows, "ckpt/s"))
    print(row("packed", packed_s, args.rows, "ckpt/s", args.rows / stacked_s, "vs stacked"))


if __name__ == "__main__":
    main()
