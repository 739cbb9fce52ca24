"""The core's one face (issue 27 item 6): ``dashboards/`` reaches the core only through
``monitor.api``, and every name the face promises is there."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import monitor.api

ROOT = Path(__file__).resolve().parents[1]


def _core_imports(folder: str) -> dict[str, set[str]]:
    """``{module: names}`` of every ``from monitor... import`` and ``import monitor...`` in
    the Python files under ``folder``, with the file and line of each."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                    node.module.split(".")[0] == "monitor":
                found.setdefault(node.module, set()).update(
                    f"{alias.name} ({where})" for alias in node.names)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "monitor":
                        found.setdefault(alias.name, set()).add(f"<module> ({where})")
    return found


def test_dashboards_import_the_core_only_through_its_face():
    imports = _core_imports("dashboards")
    assert "monitor.api" in imports, "dashboards/ no longer imports the core at all?"
    around = {module: sorted(names) for module, names in imports.items()
              if module != "monitor.api"}
    assert around == {}, f"dashboards/ imports the core around monitor.api: {around}"


def test_every_name_dashboards_take_from_the_face_is_on_it():
    taken = {entry.split(" ")[0] for entry in _core_imports("dashboards")["monitor.api"]}
    assert taken <= set(monitor.api.__all__), sorted(taken - set(monitor.api.__all__))


def test_the_face_names_what_it_exports_and_nothing_is_missing():
    assert len(set(monitor.api.__all__)) == len(monitor.api.__all__)
    for name in monitor.api.__all__:
        assert hasattr(monitor.api, name), name
    # the face is the core's own objects, not copies: a record type is the record type
    from monitor.records import StepRecord

    assert monitor.api.StepRecord is StepRecord
    assert importlib.import_module("monitor.api").RunStore.__module__ == "monitor.store.runstore"
