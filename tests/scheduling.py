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

Without xdist the same order is used; it changes nothing but the order.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

DURATIONS = Path(__file__).resolve().parent / "durations.json"
#: Seconds assumed for a test the durations file does not know yet.
DEFAULT_S = 0.2
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
    durations = load_durations()

    def seconds(item: pytest.Item) -> float:
        known = durations.get(base_nodeid(item.nodeid))
        if known is not None:
            return known
        return DEFAULT_E2E_S if item.nodeid.startswith("tests/e2e/") else DEFAULT_S

    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(_group(item) or item.nodeid, []).append(item)
    cost = {key: sum(seconds(i) for i in members) for key, members in units.items()}
    first = {key: n for n, key in enumerate(units)}
    order = sorted(units, key=lambda key: (-cost[key], first[key]))
    items[:] = [item for key in order for item in units[key]]
