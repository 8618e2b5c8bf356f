"""How long a stream from a stalling Hub takes to fail: the builder's range reader against `datasets`' reader.

    python benchmarks/bench_stream_faults.py [--stall 60] [--cap 180]

The loopback Hub sends half of one train shard and then hangs for `--stall` seconds on every request for it.
Measured: `load_dataset(..., streaming=True)` until its error (the builder reads `hf://` files through
`small_transformer_zoo.hub.remote`), and `datasets`' `xopen` reading the same shard's first bytes (20 retries around
`huggingface_hub`'s own), stopped after `--cap` seconds.
"""

from __future__ import annotations

import argparse
import threading
import time

from common import WORK, start_hub

HUB = start_hub()

from datasets.utils.file_utils import xopen  # noqa: E402

from small_transformer_zoo import Zoo, load_dataset  # noqa: E402
from small_transformer_zoo.hub.download import streaming_root  # noqa: E402
from small_transformer_zoo.hub.locate import ZooLocation  # noqa: E402
from small_transformer_zoo.testing.synthetic_zoo import write_synthetic_zoo  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stall", type=float, default=60.0, help="seconds the Hub hangs per request (default: 60)")
    parser.add_argument("--cap", type=float, default=180.0, help="seconds to wait for datasets' reader (default: 180)")
    args = parser.parse_args()
    root = WORK / "zoo"
    write_synthetic_zoo(root, "syn", runs=24, shard_size=10, register=False)
    HUB.add_dataset("bench/stall", root)
    HUB.stall_seconds = args.stall
    manifest = Zoo.open(root, "syn").manifest
    shard = "syn/" + next(s["path"] for s in manifest["shards"] if s["split"] == "train")
    HUB.cut_short.add(f"bench/stall/{shard}")

    start = time.perf_counter()
    try:
        list(load_dataset("bench/stall", "syn", split="train", streaming=True))
        outcome = "no error"
    except Exception as exc:  # noqa: BLE001 - the error is what is measured
        outcome = f"{type(exc).__name__}: {exc}"
    print(f"builder's range reader: {time.perf_counter() - start:6.1f} s  {outcome}")

    url = f"{streaming_root(ZooLocation('hub', '', 'syn', 'bench/stall'))}/{shard}"
    result: dict[str, str] = {}

    def read() -> None:
        try:
            with xopen(url, "rb") as handle:
                handle.read(8)
            result["outcome"] = "no error"
        except Exception as exc:  # noqa: BLE001
            result["outcome"] = f"{type(exc).__name__}: {' '.join(str(exc).split())[:160]}"

    start = time.perf_counter()
    worker = threading.Thread(target=read, daemon=True)
    worker.start()
    worker.join(args.cap)
    waited = time.perf_counter() - start
    print(f"datasets' xopen reader: {waited:6.1f} s  {result.get('outcome', f'still waiting after {args.cap:.0f} s')}")


if __name__ == "__main__":
    main()
