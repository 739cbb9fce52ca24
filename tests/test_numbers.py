"""finite_float and float_or_none: what the report, the summary, the wandb sink, the run store
and the simulated GPUs accept as a number."""

from __future__ import annotations

import numpy as np
import pytest

from monitor.numbers import finite_float, float_or_none, int_or_none


@pytest.mark.parametrize("value, expected", [
    (1, 1.0), (2.5, 2.5), ("3.25", 3.25), (np.float32(0.5), 0.5), (np.int64(7), 7.0),
])
def test_numbers_and_numeric_text_become_floats(value, expected):
    assert finite_float(value) == expected


@pytest.mark.parametrize("value", [
    None, True, False, np.nan, float("inf"), -float("inf"), "nan", "abc", [], {},
])
def test_missing_flags_and_non_finite_values_are_none(value):
    assert finite_float(value) is None


@pytest.mark.parametrize("value, expected", [
    (1, 1.0), ("3.25", 3.25), (np.int64(7), 7.0), (True, 1.0), (float("inf"), float("inf")),
    (None, None), (np.nan, None), ("nan", None), ("abc", None), ([], None),
])
def test_float_or_none_keeps_infinities_and_bools_but_not_nan(value, expected):
    """What the run store writes and a simulated GPU reading holds: never NaN."""
    assert float_or_none(value) == expected


@pytest.mark.parametrize("value, expected", [
    (8, 8), ("8", 8), (2.7, 2), (None, None), (True, None), (False, None), ("eight", None),
    ([8], None), (float("inf"), None), (float("nan"), None),
])
def test_int_or_none_reads_a_printed_config_count(value, expected):
    """A GPU count or batch size from the printed config: numbers and numeric text, never a
    bool, and no crash on a value that is no integer (an infinity raised OverflowError)."""
    assert int_or_none(value) == expected
