"""`stz build` and `stz merge` (registered through the `stz.commands` entry point)."""

from __future__ import annotations

import argparse
import json

from small_transformer_zoo.cli import bounded

from small_transformer_zoo.format.splits import SPLIT_UNITS

from .grid import DEFAULT_SHARED_SEED, PRECISIONS, PRESETS, SEED_POLICIES
from .tasks import get_task, task_names


def _request(args: argparse.Namespace, **extra: object) -> object:
    from .request import BuildRequest

    return BuildRequest.of(args.task, args.preset, args.out, data_dir=args.data_dir, word2vec=args.word2vec,
                           precision=args.precision, carve_from_test=args.carve_from_test,
                           seed_policy=args.seed_policy, split_by=args.split_by, shared_seed=args.shared_seed,
                           **extra)


def _build(args: argparse.Namespace) -> int:
    from .build import local_executor, run_build

    if args.ray:
        from .distributed import ray_executor

        executor = ray_executor(args.ray_address)
    else:
        executor = local_executor()
    request = _request(args, device=args.device, group_size=args.group_size, workers=args.workers,
                       num_shards=args.num_shards, shard_index=args.shard_index, confirm=args.yes,
                       max_hours=args.max_hours)
    result = run_build(request, dry_run=args.dry_run, progress=not args.no_progress, executor=executor)
    if args.dry_run:
        print(json.dumps({**result["cost"], "device": result["device"], "group_size": result["group_size"]}, indent=2))
    return 0


def _group_size(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a number of runs, got {text!r}") from None
    return bounded(int, 1)(text)


def _merge(args: argparse.Namespace) -> int:
    from .build import merge_shards

    manifest = merge_shards(_request(args), args.shards, replace=args.replace)
    print(f"merged {manifest['counts']['checkpoints']:,} checkpoints of {manifest['counts']['runs']:,} runs into "
          f"{args.out}/{manifest['config']}")
    return 0


def _add_plan_arguments(parser: argparse.ArgumentParser, what: str) -> None:
    """--seed-policy and --split-by: part of a build's plan (and its config name), so `stz merge` takes them too."""
    parser.add_argument("--seed-policy", default="per-run", choices=list(SEED_POLICIES),
                        help=f"{what}which of a run's random streams (initialisation; subset, batch order and crops; "
                             "dropout) come from the one --shared-seed: per-run: none, every run its own seed "
                             "(independent runs); shared: all three, as in the original release (one initial draw "
                             "made with each run's init std, one subset per train fraction, one batch order, one set "
                             "of crops and dropout masks: runs that share an initialisation, as fine-tunes of one "
                             "checkpoint do); shared-init: only the initialisation; shared-data: only the subset, "
                             "batch order and crops. The config name then ends in -shared-seed, -shared-init or "
                             "-shared-data (default: per-run)")
    parser.add_argument("--shared-seed", type=bounded(int, 0), default=DEFAULT_SHARED_SEED,
                        help=f"{what}the seed of the shared streams (default: {DEFAULT_SHARED_SEED}, the original "
                             "release's); another seed is added to the config name (mnist-families-shared-seed-7)")
    parser.add_argument("--split-by", default="run", choices=list(SPLIT_UNITS),
                        help=f"{what}run: each run's split by a hash of its id; family: runs that differ only in L2 "
                             "and init std share a split, so near-clones never straddle train and test; the config "
                             "name then ends in -family-split (default: run)")


def register(sub: argparse._SubParsersAction) -> None:
    build = sub.add_parser("build", help="train a zoo (resumable; --num-shards/--shard-index for array jobs)")
    build.add_argument("--task", required=True, choices=task_names(),
                       help="registered task: " + "; ".join(f"{t} ({get_task(t).data_help})" for t in task_names()))
    build.add_argument("--preset", default="mini", choices=list(PRESETS),
                       help="how much of the recipe: " + "; ".join(f"{p.name} ({p.runs or 'all'} runs, {p.epochs} "
                                                                   f"epochs)" for p in PRESETS.values())
                            + " (default: mini)")
    build.add_argument("--out", required=True, help="zoo root to write")
    _add_plan_arguments(build, "")
    build.add_argument("--data-dir", help="where the task's data is (see --task), or hf://datasets/<repo> to load it "
                                          "from the Hub (default: the task's own source)")
    build.add_argument("--word2vec", help="agnews: a pretrained word2vec text file (`word v1 v2 ...` per line) for "
                                          "the embedding, reduced to 32 dims by PCA, instead of one built from the corpus")
    build.add_argument("--num-shards", type=bounded(int, 1), default=1,
                       help="split the run groups into this many shards (default: 1)")
    build.add_argument("--shard-index", type=bounded(int, 0), default=0, help="which shard this process trains (0-based)")
    build.add_argument("--dry-run", action="store_true", help="print the plan and its cost, train nothing")
    build.add_argument("--device", default="auto",
                       help="auto (CUDA when torch sees a GPU, else the CPU), cpu, cuda or cuda:N (default: auto)")
    build.add_argument("--precision", default="fp32", choices=PRECISIONS,
                       help="bf16: autocast matmuls in bfloat16, weights, optimizer state and checkpoints stay "
                            "float32 (default: fp32)")
    build.add_argument("--group-size", default="auto", type=_group_size,
                       help="runs trained together in one vectorized step; auto: the preset's on a CPU, as many as "
                            "fit in free memory on a GPU (default: auto)")
    build.add_argument("--workers", type=bounded(int, 1), help="CPU: groups trained at a time (default: one per core)")
    build.add_argument("--carve-from-test", action="store_true",
                       help="a --data-dir with only the test files: train on 80%% of them and test on the rest, on "
                            "purpose (without it such a folder is refused; the manifest and card say so)")
    build.add_argument("--yes", action="store_true", help="start a build estimated to take more than 4 hours")
    build.add_argument("--max-hours", type=bounded(float, 0, low_open=True),
                       help="start the build only if it is estimated to take at most this many hours")
    build.add_argument("--ray", action="store_true", help="train the groups as tasks on a Ray cluster")
    build.add_argument("--ray-address", help="Ray cluster address (default: start a local Ray instance)")
    build.add_argument("--no-progress", action="store_true", help="no progress bars")
    build.set_defaults(func=_build)

    merge = sub.add_parser("merge", help="join the outputs of sharded builds into one zoo")
    merge.add_argument("out", help="zoo root to write")
    merge.add_argument("shards", nargs="+", help="the --out folders of the shards")
    merge.add_argument("--task", required=True, choices=task_names(), help="the --task the shards were built with")
    merge.add_argument("--preset", default="mini", choices=list(PRESETS),
                       help="the --preset the shards were built with (default: mini)")
    merge.add_argument("--data-dir", help="the --data-dir the shards were built with")
    merge.add_argument("--word2vec", help="the --word2vec file the shards were built with")
    merge.add_argument("--precision", default="fp32", choices=PRECISIONS, help="the --precision the shards used (default: fp32)")
    merge.add_argument("--carve-from-test", action="store_true", help="the shards were built with --carve-from-test")
    _add_plan_arguments(merge, "as the shards were built: ")
    merge.add_argument("--replace", action="store_true", help="replace a zoo of the same config already in OUT")
    merge.set_defaults(func=_merge)
