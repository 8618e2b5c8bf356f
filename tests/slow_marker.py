"""The `slow` marker check: every test that takes more than `--slow-seconds` of CPU time (20 by default; setup,
call and teardown together, the subprocesses it waits for included) should be marked `slow`, so that `pytest -m
"not slow"` stays a quick run. CPU time, not wall time: on a loaded machine a quick test waits longer for a core
but does no more work. The run names each unmarked one at the end; with `--strict-slow` it fails. A warning by
default, because a slower machine takes longer and a test must not fail for the machine's speed."""

from __future__ import annotations

import resource
from collections import defaultdict

import pytest

_SECONDS: dict[str, float] = defaultdict(float)
_MARKED_SLOW: set[str] = set()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("slow marker")
    group.addoption("--slow-seconds", type=float, default=20.0,
                    help="a test that takes more CPU seconds is expected to be marked `slow` (default: 20)")
    group.addoption("--strict-slow", action="store_true",
                    help="fail the run if a test not marked `slow` took longer than --slow-seconds")


def cpu_seconds() -> float:
    """User and system CPU time of this process and of the children it has waited for."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    """Each test's CPU time, its fixtures' setup and teardown included."""
    started = cpu_seconds()
    try:
        return (yield)
    finally:
        _SECONDS[item.nodeid] += cpu_seconds() - started
        if item.get_closest_marker("slow") is not None:
            _MARKED_SLOW.add(item.nodeid)


def unmarked_slow_tests(limit: float) -> dict[str, float]:
    """Tests of this run that took longer than `limit` seconds and are not marked `slow`."""
    return {node: seconds for node, seconds in _SECONDS.items() if seconds > limit and node not in _MARKED_SLOW}


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    limit = config.getoption("slow_seconds")
    over = unmarked_slow_tests(limit)
    if not over:
        return
    terminalreporter.section(f"tests over {limit:g} s not marked slow")
    for node, seconds in sorted(over.items(), key=lambda item: -item[1]):
        terminalreporter.write_line(f"{seconds:6.1f} s of CPU  {node}  (mark it @pytest.mark.slow)")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if config.getoption("strict_slow") and exitstatus == pytest.ExitCode.OK and \
            unmarked_slow_tests(config.getoption("slow_seconds")):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
