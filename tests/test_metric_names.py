"""The metric-name contract: every exported name is documented in docs/metrics.md with its type,
the docs name nothing that is not exported, and the naming conventions hold."""

from __future__ import annotations

import re
from pathlib import Path

from monitor import metric_names

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
NAMES = {v for k, v in vars(metric_names).items()
         if k.isupper() and k != "PREFIX" and isinstance(v, str)}


def _expand(cell: str) -> list[str]:
    """```verlmon_a_{x,y}_b``` -> [verlmon_a_x_b, verlmon_a_y_b]; "`a_used_bytes` / `_total_bytes`"
    -> the second name built on the first's stem."""
    tokens = re.findall(r"`([^`]+)`", cell)
    out: list[str] = []
    for tok in tokens:
        if tok.startswith("_") and out:
            stem = out[-1].rsplit("_", 2)[0]  # verlmon_gpu_memory_used_bytes -> ..._memory
            out.append(stem + tok)
            continue
        m = re.fullmatch(r"(.*)\{([^}]+)\}(.*)", tok)
        if m:
            out.extend(m.group(1) + alt + m.group(3) for alt in m.group(2).split(","))
        else:
            out.append(tok)
    return out


def _documented() -> dict[str, str]:
    types: dict[str, str] = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not cells[0].startswith("`verlmon_"):
            continue
        for name in _expand(cells[0]):
            types[name] = cells[1]
    return types


def test_every_exported_name_is_documented_and_nothing_else():
    documented = _documented()
    assert sorted(NAMES - set(documented)) == [], "add these to docs/metrics.md"
    assert sorted(set(documented) - NAMES) == [], "docs/metrics.md names metrics nobody exports"


def test_counters_and_only_counters_end_in_total():
    for name, kind in _documented().items():
        assert kind in ("gauge", "counter", "info", "histogram", "summary"), (name, kind)
        assert (kind == "counter") == name.endswith("_total"), (name, kind)


def test_names_follow_prometheus_conventions():
    for name in NAMES:
        assert name.startswith(metric_names.PREFIX), name
        assert re.fullmatch(r"[a-z_][a-z0-9_]*", name), name
        # base units only: no milliseconds, megabytes or percent in a name
        assert not re.search(r"_(ms|milliseconds|mb|megabytes|gb|percent)(_|$)", name), name
