"""The `slow` marker check: every test that takes more than `--slow-seconds` (20 by default; setup, call and
teardown together) should be marked `slow`, so that `pytest -m "not slow"` stays a quick run. The run names each
unmarked one at the end; with `--strict-slow` it fails. A warning by default, because a loaded or slower machine
takes longer and a test must not fail for the machine's speed."""

from __future__ import annotations

from collections import defaultdict

import pytest

_SECONDS: dict[str, float] = defaultdict(float)
_MARKED_SLOW: set[str] = set()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("slow marker")
    group.addoption("--slow-seconds", type=float, default=20.0,
                    help="a test that takes longer is expected to be marked `slow` (default: 20)")
    group.addoption("--strict-slow", action="store_true",
                    help="fail the run if a test not marked `slow` took longer than --slow-seconds")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> pytest.TestReport:
    """Each test's time, its fixtures' setup included."""
    report = yield
    _SECONDS[item.nodeid] += call.duration
    if item.get_closest_marker("slow") is not None:
        _MARKED_SLOW.add(item.nodeid)
    return report


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
        terminalreporter.write_line(f"{seconds:6.1f} s  {node}  (mark it @pytest.mark.slow)")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if config.getoption("strict_slow") and exitstatus == pytest.ExitCode.OK and \
            unmarked_slow_tests(config.getoption("slow_seconds")):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
