"""Import speed of `stz import-original` on a release in the authors' layout (random weights, real files).

    python benchmarks/bench_import.py [--runs 1000]   # 1,000 runs x 5 checkpoints = 5,000 .pt files

Prints checkpoints per second of the import from the unpacked folder (one process, then one per core) and from the
release zip (one per core), each against the floor measured in the same run (reading and `torch.load`ing every
file in one process, nothing else), and the projected time for the whole release (125,000 checkpoints).
"""

from __future__ import annotations

import argparse
import io
import time
import zipfile

from common import WORK, start_hub

HUB = start_hub()

import torch  # noqa: E402

from small_transformer_zoo.devices import usable_cores  # noqa: E402
from small_transformer_zoo.original import import_original  # noqa: E402
from small_transformer_zoo.testing.synthetic_release import write_synthetic_release  # noqa: E402

RELEASE_CHECKPOINTS = 125_000


def load_every_file(paths: list) -> int:
    """The floor: each .pt file read and torch.load'ed (weights_only), as any importer must."""
    for path in paths:
        torch.load(io.BytesIO(path.read_bytes()), map_location="cpu", weights_only=True)
    return len(paths)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=1000)
    args = parser.parse_args()
    release = write_synthetic_release(WORK / "unpacked", runs=args.runs)
    files = sorted((release.top / "mnist").glob("*.pt"))
    archive = WORK / "MNIST-Transformers.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as handle:
        for path in sorted(release.top.rglob("*")):
            handle.write(path, path.relative_to(release.top.parent).as_posix())
    print(f"release: {len(files):,} .pt files of {args.runs:,} runs, zip {archive.stat().st_size / 2**20:,.0f} MiB")
    start = time.perf_counter()
    load_every_file(files)
    floor = len(files) / (time.perf_counter() - start)
    print(f"  {'read + torch.load of every file (floor)':<44}{floor:10,.0f} ckpt/s")
    cores = usable_cores()
    for label, source, workers in (("folder, 1 process", release.top, 1),
                                   (f"folder, {cores} processes", release.top, cores),
                                   (f"zip, {cores} processes", archive, cores)):
        start = time.perf_counter()
        result = import_original(source, WORK / "out", "bench", overwrite=True, workers=workers, part_size=500)
        rate = result.manifest["counts"]["checkpoints"] / (time.perf_counter() - start)
        print(f"  {'import from the ' + label:<44}{rate:10,.0f} ckpt/s  {rate / floor:5.2f}x the floor   whole "
              f"release ({RELEASE_CHECKPOINTS:,}): {RELEASE_CHECKPOINTS / rate / 60:5.1f} min")

if __name__ == "__main__":
    main()
