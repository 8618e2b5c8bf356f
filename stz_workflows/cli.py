"""The `stz quickstart` subcommand (registered through the `stz.commands` entry point); the work is in
`stz_workflows.quickstart`, loaded when the command runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from small_transformer_zoo.cli import bounded


def _quickstart(args: argparse.Namespace) -> int:
    from .quickstart import run_quickstart

    return run_quickstart(args.out, args.preset, args.epochs, device=args.device)


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser("quickstart", help="the README's main job: build, load, learn from and plot a zoo")
    parser.add_argument("--out", type=Path, default=Path("stz-out"), help="zoo root (default ./stz-out)")
    parser.add_argument("--preset", default="mini", choices=("tiny", "mini"),
                        help="zoo to build: mini (132 runs, minutes) or tiny (20 runs, seconds) (default: mini)")
    parser.add_argument("--epochs", type=bounded(int, 1), default=30,
                        help="training epochs of Transformer-NFN and the neural baselines (default: 30)")
    parser.add_argument("--device", default="auto", help="where the zoo and the neural models train: auto (CUDA when "
                                                         "torch sees a GPU), cpu, cuda or cuda:N (default: auto)")
    parser.set_defaults(func=_quickstart)
