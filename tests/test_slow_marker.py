"""The `slow` marker check (tests/slow_marker.py), run on a small suite of its own in a child pytest: it judges
by CPU time, so a test that only waits is not named."""

from __future__ import annotations

import pytest

from tests.helpers import PROJECT

SUITE = """
import time
import pytest

def busy(seconds):
    started = time.process_time()
    while time.process_time() - started < seconds:
        pass

def test_quick():
    pass

def test_waiting_is_not_working():
    time.sleep(0.4)

def test_unmarked_and_slow():
    busy(0.4)

@pytest.mark.slow
def test_marked_and_slow():
    busy(0.4)
"""


@pytest.mark.parametrize("strict", [False, True])
def test_an_unmarked_slow_test_is_named_and_fails_a_strict_run(pytester: pytest.Pytester, strict: bool,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_suite=SUITE)
    monkeypatch.setenv("PYTHONPATH", str(PROJECT))
    args = ["-p", "tests.slow_marker", "--slow-seconds", "0.2", "-p", "no:cacheprovider"]
    result = pytester.runpytest_subprocess(*args, *(["--strict-slow"] if strict else []))
    result.stdout.fnmatch_lines(["*tests over 0.2 s not marked slow*", "*test_suite.py::test_unmarked_and_slow*"])
    result.stdout.no_fnmatch_line("*s of CPU  test_suite.py::test_marked_and_slow*")
    result.stdout.no_fnmatch_line("*s of CPU  test_suite.py::test_quick*")
    result.stdout.no_fnmatch_line("*test_suite.py::test_waiting_is_not_working*")
    assert result.ret == (pytest.ExitCode.TESTS_FAILED if strict else pytest.ExitCode.OK)


def test_a_suite_without_slow_tests_passes_a_strict_run(pytester: pytest.Pytester,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_suite="def test_quick():\n    pass\n")
    monkeypatch.setenv("PYTHONPATH", str(PROJECT))
    result = pytester.runpytest_subprocess("-p", "tests.slow_marker", "--strict-slow", "-p", "no:cacheprovider")
    result.stdout.no_fnmatch_line("*not marked slow*")
    assert result.ret == pytest.ExitCode.OK
