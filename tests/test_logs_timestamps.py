"""Leading timestamps: ISO 8601 with offsets, bracketed, Python logging's comma form."""

from __future__ import annotations

import pytest

from monitor.logs.timestamps import parse_timestamp, split_timestamp

BASE = 1767323045.0  # 2026-01-02T03:04:05Z


@pytest.mark.parametrize(
    ("line", "expected", "rest"),
    [
        ("2026-01-02T03:04:05Z step:1", BASE, "step:1"),
        ("2026-01-02T03:04:05.123Z step:1", BASE + 0.123, "step:1"),
        ("2026-01-02T05:04:05+02:00 x", BASE, "x"),
        ("2026-01-01T22:04:05.5-0500 x", BASE + 0.5, "x"),
        ("2026-01-02T03:04:05 naive", BASE, "naive"),  # naive times are UTC
        ("[2026-01-02 03:04:05] (TaskRunner pid=1) y", BASE, "(TaskRunner pid=1) y"),
        ("[2026-01-02 03:04:05.250] y", BASE + 0.25, "y"),
        ("2026-01-02 03:04:05,123 INFO z", BASE + 0.123, "INFO z"),
        ("  2026-01-02 03:04:05 indented", BASE, "indented"),
        ("2026-01-02T03:04:05.123456789Z ns", BASE + 0.123456789, "ns"),
    ],
)
def test_split_timestamp(line: str, expected: float, rest: str) -> None:
    value, remainder = split_timestamp(line)
    assert value == pytest.approx(expected, abs=1e-6)
    assert remainder == rest


@pytest.mark.parametrize(
    "line",
    [
        "step:1 - a:1",
        "2026-13-02T03:04:05Z month 13",
        "2026-01-02T25:04:05Z hour 25",
        "2026-01-02",
        "20260102T030405Z",
        "",
        "[not a time]",
        "12:00:00 time only",
    ],
)
def test_lines_without_a_valid_timestamp_are_left_alone(line: str) -> None:
    assert split_timestamp(line) == (None, line)


def test_parse_timestamp_needs_the_whole_string() -> None:
    assert parse_timestamp("2026-01-02T03:04:05Z") == BASE
    assert parse_timestamp(" 2026-01-02 03:04:05 ") == BASE
    assert parse_timestamp("2026-01-02T03:04:05Z trailing") is None
    assert parse_timestamp("yesterday") is None
