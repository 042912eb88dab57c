"""A pytest plugin (loaded by tests/conftest.py) that counts the worker groups each test starts in the test processes
and prints them at the end of the run: a group start is about 10 s of a 2-core machine (a Ray Train controller, an
event sink and a process per worker, each importing torch), the largest single cost of the suite
(tests/README.md), and a test that stops sharing the pool's groups shows up here first. Groups that subprocess
drivers start (their own processes) are not counted."""

from __future__ import annotations

import collections
import os

import pytest

_STARTS: list = []  # the nodeid of the test running when each group was put into the pool
KEY = "worker_group_starts"


def _current_test() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]


def pytest_configure(config):
    from raytrainer.coordinator import holders

    if getattr(holders.hold, "counted", False):
        return
    original = holders.hold

    def hold(group):  # dispatch.py calls holders.hold(group) once for every group it starts
        _STARTS.append(_current_test())
        return original(group)

    hold.counted = True
    holders.hold = hold


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "teardown":  # user_properties travel from xdist's processes to the one that reports
        report.user_properties.append((KEY, sum(1 for nodeid in _STARTS if nodeid == item.nodeid)))


def pytest_terminal_summary(terminalreporter):
    per_file: collections.Counter = collections.Counter()
    for reports in terminalreporter.stats.values():
        for report in reports:
            for name, value in getattr(report, "user_properties", ()) or ():
                if name == KEY and value and getattr(report, "when", None) == "teardown":
                    per_file[report.nodeid.split("::")[0]] += value
    if per_file:
        listed = ", ".join(f"{path.removeprefix('tests/')} {n}" for path, n in per_file.most_common())
        terminalreporter.write_line(f"worker group starts in the test processes: {sum(per_file.values())} "
                                    f"({listed})")
