"""Files several processes update at once (the leaderboard's results, the registry of local zoos): every writer's
update is kept, because each rereads the file under its lock."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from nfn_baselines.leaderboard.scoring import add_result, load_leaderboard
from small_transformer_zoo.store.files import LockedError, exclusive_lock
from tests.helpers import HANG_TIMEOUT

WRITERS, EACH = 6, 8


def _add_results(board: str, writer: int, start: multiprocessing.synchronize.Event) -> None:
    start.wait()
    for i in range(EACH):
        add_result(board, f"model-{writer}-{i}", "syn", "test", {"tau": 0.1 * writer, "r2": 0.0, "l1": 0.3}, "test")


def _register(home: str, writer: int, start: multiprocessing.synchronize.Event) -> None:
    import os

    os.environ["STZ_HOME"] = home
    from small_transformer_zoo.store.local_index import register_local_zoo

    start.wait()
    for i in range(EACH):
        register_local_zoo(f"config-{writer}-{i}", home)


def _run_at_once(target, first: str) -> None:
    context = multiprocessing.get_context("fork")
    start = context.Event()
    workers = [context.Process(target=target, args=(first, w, start)) for w in range(WRITERS)]
    for worker in workers:
        worker.start()
    start.set()
    for worker in workers:
        worker.join(timeout=HANG_TIMEOUT)
        assert worker.exitcode == 0


def test_concurrent_leaderboard_writers_keep_every_entry(tmp_path: Path) -> None:
    board = tmp_path / "results.json"
    _run_at_once(_add_results, str(board))
    names = sorted(e["name"] for e in load_leaderboard(board))
    assert names == sorted(f"model-{w}-{i}" for w in range(WRITERS) for i in range(EACH))


def test_concurrent_registrations_keep_every_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _run_at_once(_register, str(tmp_path))
    monkeypatch.setenv("STZ_HOME", str(tmp_path))
    from small_transformer_zoo.store.local_index import _read

    assert sorted(_read()) == sorted(f"config-{w}-{i}" for w in range(WRITERS) for i in range(EACH))


def test_a_waiting_lock_gives_up_naming_the_holder(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    held, release = context.Event(), context.Event()

    def hold() -> None:
        with exclusive_lock(tmp_path, "results.json", "a test holder"):
            held.set()
            release.wait()

    holder = context.Process(target=hold)
    holder.start()
    try:
        assert held.wait(HANG_TIMEOUT)
        with pytest.raises(LockedError, match=r"a test holder.*waited 0\.2 s"):
            with exclusive_lock(tmp_path, "results.json", "this test", wait=0.2):
                pass
    finally:
        release.set()
        holder.join(HANG_TIMEOUT)
    with exclusive_lock(tmp_path, "results.json", "this test", wait=0.2):
        pass
