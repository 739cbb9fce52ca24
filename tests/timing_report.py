"""A pytest plugin that measures every test's wall time and CPU time, so a slow addition shows.

For each test it records the wall seconds of setup, call and teardown, the CPU seconds the
test process spent in them (``time.process_time``) and the CPU seconds of the child processes
it reaped in that time (``RUSAGE_CHILDREN``: the CLI, exporters, Prometheus, Chromium...).
Wall time minus both CPU times is waiting: sleeps, real-time playback, server start-ups.

At the end of the run it prints the 20 slowest tests with their CPU share, the slowest files
and the total, and, with ``--times-json PATH``, writes every row to a JSON file (the tables in
``bench/results/test_times_*`` are made from it by ``bench/test_times.py``). Under xdist the
figures travel from the workers to the controller in each report's ``user_properties``.
"""

from __future__ import annotations

import json
import resource
import time
from collections import defaultdict
from pathlib import Path

import pytest
from scheduling import base_nodeid

_KEY = "timing_report"
SLOWEST = 20


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--times-json PATH``: write every test's wall and CPU seconds to PATH."""
    parser.addoption("--times-json", default=None, metavar="PATH",
                     help="write each test's wall, CPU and child CPU seconds as JSON to PATH")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Attach the phase's CPU seconds (own and reaped children) to its report."""
    start = getattr(item, "_timing_start", None)
    outcome = yield
    report = outcome.get_result()
    if start is not None:
        cpu0, child0 = start
        report.user_properties.append(
            (_KEY, {"cpu": time.process_time() - cpu0, "child_cpu": _children_cpu() - child0}))


def _mark_start(item: pytest.Item) -> None:
    item._timing_start = (time.process_time(), _children_cpu())  # type: ignore[attr-defined]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    _mark_start(item)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_call(item: pytest.Item) -> None:
    _mark_start(item)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    _mark_start(item)


class _Collector:
    """Sums the phases of each test as the reports arrive (on the controller under xdist)."""

    def __init__(self) -> None:
        self.rows: dict[str, dict[str, float]] = defaultdict(
            lambda: {"wall": 0.0, "cpu": 0.0, "child_cpu": 0.0})
        self.started = time.monotonic()

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        row = self.rows[base_nodeid(report.nodeid)]
        row["wall"] += report.duration
        for key, value in report.user_properties:
            if key == _KEY:
                row["cpu"] += value["cpu"]
                row["child_cpu"] += value["child_cpu"]

    def files(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = defaultdict(
            lambda: {"wall": 0.0, "cpu": 0.0, "child_cpu": 0.0, "tests": 0})
        for nodeid, row in self.rows.items():
            agg = out[nodeid.split("::", 1)[0]]
            for k in ("wall", "cpu", "child_cpu"):
                agg[k] += row[k]
            agg["tests"] += 1
        return out


def _line(name: str, row: dict[str, float]) -> str:
    wait = max(0.0, row["wall"] - row["cpu"] - row["child_cpu"])
    return (f"{row['wall']:8.2f}s wall {row['cpu']:7.2f}s cpu {row['child_cpu']:7.2f}s child "
            f"{wait:8.2f}s wait  {name}")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_Collector(), "timing_report_collector")


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    """Print the slowest tests and files and the total; write the JSON where asked."""
    collector: _Collector = config.pluginmanager.get_plugin("timing_report_collector")
    if collector is None or not collector.rows:
        return
    rows = collector.rows
    tr = terminalreporter
    tr.write_sep("=", f"{SLOWEST} slowest tests (wall, own CPU, children's CPU, waiting)")
    for nodeid, row in sorted(rows.items(), key=lambda kv: -kv[1]["wall"])[:SLOWEST]:
        tr.write_line(_line(nodeid, row))
    files = collector.files()
    tr.write_sep("-", f"{min(10, len(files))} slowest files")
    for name, row in sorted(files.items(), key=lambda kv: -kv[1]["wall"])[:10]:
        tr.write_line(_line(f"{name} ({int(row['tests'])} tests)", row))
    total = {k: sum(r[k] for r in rows.values()) for k in ("wall", "cpu", "child_cpu")}
    elapsed = time.monotonic() - collector.started
    tr.write_line(f"total: {len(rows)} tests, {elapsed:.0f} s elapsed, {total['wall']:.0f} s of "
                  f"test time ({total['cpu']:.0f} s own CPU, {total['child_cpu']:.0f} s children's)")
    path = config.getoption("--times-json")
    if path:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(
            {"elapsed_s": elapsed, "tests": dict(sorted(rows.items()))}, indent=0))
