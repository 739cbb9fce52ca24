"""Printed numbers of every verl era, JSON values, and the number-format vote."""

from __future__ import annotations

import math

import pytest

from monitor.logs.values import json_number, to_number, value_format


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.000", 1.0),
        ("2e-06", 2e-06),
        ("34", 34.0),
        ("-0.5", -0.5),
        ("True", True),
        ("False", False),
        ("np.float64(0.5)", 0.5),
        ("np.float32(-1.25)", -1.25),
        ("np.int64(-1)", -1),
        ("np.True_", True),
        ("np.False_", False),
        ("np.float64(inf)", math.inf),
        ("tensor(0.2500)", 0.25),
        ("inf", math.inf),
        ("-inf", -math.inf),
    ],
)
def test_to_number(text: str, expected: object) -> None:
    value = to_number(text)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize("text", ["", "abc", "np.float64(x)", "np.float64(", "1.0.0", "None"])
def test_not_numbers(text: str) -> None:
    assert to_number(text) is None


def test_nan_forms() -> None:
    assert math.isnan(to_number("nan"))
    assert math.isnan(to_number("np.float64(nan)"))
    assert math.isnan(json_number(None))


def test_json_values() -> None:
    assert json_number(3) == 3 and json_number(True) is True and json_number(0.5) == 0.5
    assert json_number("1.5") == 1.5
    assert json_number([1, 2]) is None and json_number({"a": 1}) is None


def test_value_format_votes() -> None:
    assert value_format(["1.000", "0.000", "3072.000", "nan", "-0.125", "12.500"]) == "3dec"
    assert value_format(["1", "2e-06", "3072.0", "0.5", "1.25"]) == "repr"
    assert value_format(["np.float64(0.5)"]) == "numpy"
    assert value_format(["1.000", "2.000"]) is None  # too few to tell


def test_verls_minus_one_for_preemptions_not_tracked_is_not_an_absurd_timer():
    """timing_s/agent_loop/num_preempted/* counts (it sits under timing_s/): verl prints -1
    where the engine does not say; two real agent-loop runs had it counted as unreadable."""
    from monitor.logs.values import absurd_durations

    metrics = {"timing_s/agent_loop/num_preempted/max": -1, "timing_s/gen": -3.0,
               "timing_s/agent_loop/slowest/num_preempted": -1}
    assert absurd_durations(metrics) == {"timing_s/gen": -3.0}
