"""A pytest plugin that orders the suite for running on several workers (pytest-xdist).

``make test`` runs the whole suite with ``-n 4 --dist loadgroup --no-loadscope-reorder``: most
of its wall time is waiting (real-time playback, 15 s scrapes, server start-ups, installs),
so four workers share two cores well. Two things make that safe and short:

- **Groups.** A module that defines a fixture shared by its tests (module or session scope:
  one Prometheus, one Streamlit app, one browser page, a parsed recording) has all its tests
  sent to one worker (an ``xdist_group`` named after the module), so the fixture is set up once;
  the other tests are spread one by one. A module may name its own group (``pytestmark =
  pytest.mark.xdist_group("name")``) to keep tests that need the same resource together, or a
  parameter to group by (``GROUP_BY_PARAM = "run"``): the tests of one recording, whose
  analysis the module caches, then run on one worker.
- **Longest first.** The work units (a group, or a lone test) are ordered by their measured
  wall time, longest first (``tests/durations.json``, written by ``bench/test_times.py`` from a
  ``--times-json`` run; a test not in it counts as ``DEFAULT_S``, an end-to-end one as
  ``DEFAULT_E2E_S``), so the ten-minute real-time tests start at once and the short ones fill in
  around them. The order is the same on every worker (xdist requires it).
- **No prefetch behind a long test.** xdist hands a worker its next unit while it still has two
  tests or fewer pending; a worker running a ten-minute test would take the next long unit
  with it and finish last. Here a worker holding two tests gets more only when they are
  expected to take under ``PREFETCH_S`` (``pytest_xdist_make_scheduler``); one holding a single
  test always gets more, since an xdist worker runs a test only once it holds the next.
- **Groups that hold.** The ``@group`` suffix the scheduler splits units by is written here
  (``_name_groups``): xdist 3.8 writes it where pytest 9.2 no longer reads it.

Without xdist the same order is used; it changes nothing but the order.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DURATIONS = Path(__file__).resolve().parent / "durations.json"
#: Seconds assumed for a test the durations file does not know yet.
DEFAULT_S = 0.2
#: A worker is handed more work while what it holds is expected to take less than this.
PREFETCH_S = 20.0
DEFAULT_E2E_S = 30.0
_SHARED_SCOPES = ("module", "session", "package", "class")


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    """nodeid -> seconds from the durations file (empty when it is missing or unreadable)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))}


def base_nodeid(nodeid: str) -> str:
    """A node id without the ``@group`` suffix xdist adds under ``--dist loadgroup``."""
    at, bracket = nodeid.rfind("@"), nodeid.rfind("]")
    return nodeid[:at] if at > bracket else nodeid


def _module_id(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


def _shares_a_fixture(item: pytest.Item) -> bool:
    """Whether the item uses a fixture of wider than function scope defined in its module."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    module = _module_id(item)
    for defs in info.name2fixturedefs.values():
        for fd in defs:
            if fd.scope in _SHARED_SCOPES and getattr(fd, "baseid", "") == module:
                return True
    return False


def _group(item: pytest.Item) -> str | None:
    own = item.get_closest_marker("xdist_group")
    if own is not None:
        return str(own.args[0] if own.args else own.kwargs.get("name", "default"))
    return None


def _param_group(item: pytest.Item) -> str | None:
    """The group of a module that names a parameter to group by (``GROUP_BY_PARAM``): every
    test of one recording or log on one worker, which then reads and analyses it once."""
    name = getattr(getattr(item, "module", None), "GROUP_BY_PARAM", None)
    spec = getattr(item, "callspec", None)
    if not name or spec is None or name not in spec.params:
        return None
    value = spec.params[name]
    return f"{_module_id(item)}:{getattr(value, 'name', value)}"


def _name_groups(items: list[pytest.Item]) -> None:
    """Give each grouped test's node id its ``@group`` suffix, which the loadgroup scheduler
    splits work units by. xdist 3.8 writes it into ``item._nodeid``, which pytest 9.2 no
    longer reads (a node's id is ``item._id``): measured, every test of a module with a shared
    fixture then ran as a unit of its own, and each worker started the fixture's servers. A
    suffix already there is kept."""
    for item in items:
        name = _group(item)
        if name is None or base_nodeid(item.nodeid) != item.nodeid:
            continue
        named = f"{item.nodeid}@{name}"
        if hasattr(item, "_id"):  # pytest >= 9.2: a structured id, printed as given
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(named)  # noqa: SLF001
        else:
            item._nodeid = named  # noqa: SLF001


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group the tests of modules with shared fixtures, then order the work units longest
    first (before xdist reads the groups: ``tryfirst``)."""
    shared = {_module_id(i) for i in items if _shares_a_fixture(i)}
    for item in items:
        if _group(item) is not None:
            continue
        by_param = _param_group(item)
        if by_param is not None:
            item.add_marker(pytest.mark.xdist_group(by_param))
        elif _module_id(item) in shared:
            item.add_marker(pytest.mark.xdist_group(_module_id(item)))
    if getattr(config.option, "loadgroup", False):  # set on xdist's workers only
        _name_groups(items)
    durations = load_durations()

    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(_group(item) or item.nodeid, []).append(item)
    cost = {key: sum(_seconds(i.nodeid, durations) for i in members)
            for key, members in units.items()}
    first = {key: n for n, key in enumerate(units)}
    order = sorted(units, key=lambda key: (-cost[key], first[key]))
    items[:] = [item for key in order for item in units[key]]


def _seconds(nodeid: str, durations: dict[str, float]) -> float:
    """A test's expected seconds: its measured duration, else the default for its kind."""
    known = durations.get(base_nodeid(nodeid))
    if known is not None:
        return known
    return DEFAULT_E2E_S if nodeid.startswith("tests/e2e/") else DEFAULT_S


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under ``--dist loadgroup``: xdist's own scheduler, handing a worker more work only when
    what it holds is short (``PREFETCH_S``), so no unit waits behind a long test."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler.loadgroup import LoadGroupScheduling

    durations = load_durations()

    class LongestFirst(LoadGroupScheduling):
        def _reschedule(self, node: object) -> None:
            if node.shutting_down:  # type: ignore[attr-defined]
                return
            if not self.workqueue:
                node.shutdown()  # type: ignore[attr-defined]
                return
            pending = [nid for unit in self.assigned_work[node].values()
                       for nid, done in unit.items() if not done]
            # a worker runs a test only once it holds the next one (for the teardown of the
            # fixtures they do not share): with one test pending it waits, so it always gets
            # more; with two it runs the first, and more would wait behind it
            if len(pending) > 2 or (len(pending) == 2 and sum(
                    _seconds(n, durations) for n in pending) > PREFETCH_S):
                return
            self._assign_work_unit(node)

    return LongestFirst(config, log)
