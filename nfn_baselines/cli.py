"""The `stz` subcommands of nfn_baselines (registered through the `stz.commands` entry point)."""

from __future__ import annotations

import argparse

from .quickstart import register as register_quickstart


def register(sub: argparse._SubParsersAction) -> None:
    register_quickstart(sub)
