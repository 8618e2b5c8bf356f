"""Small printing helpers shared by `stz` subcommands."""

from __future__ import annotations


def print_header(text: str) -> None:
    print(f"\n== {text}", flush=True)
