"""The Overview's SVG trends: the shape of each series, gaps where values are missing, the
flagged steps marked, words when there is nothing to draw."""

from __future__ import annotations

import base64
import re

import numpy as np

from dashboards.sparkline import Line, trend_html


def _svg(block: str) -> str:
    (data,) = re.findall(r'src="data:image/svg\+xml;base64,([^"]+)"', block)
    return base64.b64decode(data).decode()


def test_each_line_is_a_path_from_step_to_step_with_a_gap_where_a_value_is_missing():
    y = np.array([10.0, 12.0, np.nan, 11.0, 30.0])
    block = trend_html("Step time", [1, 2, 3, 4, 5],
                       [Line("step time", y, "#4C78A8"),
                        Line("median", np.array([10, 11, 11, 11, 11.5]), "#555", dotted=True)],
                       "seconds", marks={5.0: "step 5: spike"})
    svg = _svg(block)
    paths = re.findall(r'<path d="([^"]+)"', svg)
    assert len(paths) == 2
    # the missing step 3 splits the first line in two: a second "M"ove, never a line through 0
    assert paths[0].count("M") == 2 and paths[0].count("L") == 2
    assert paths[1].count("M") == 1 and 'stroke-dasharray="4 4"' in svg
    # the highest value tops the y axis; the steps are written on the x axis
    assert ">30.0</text>" in svg and ">step 1</text>" in svg and ">step 5</text>" in svg
    # the flagged step is a red dot on the first line, at its highest point
    (dot,) = re.findall(r'<circle cx="([0-9.]+)" cy="([0-9.]+)"', svg)
    assert float(dot[1]) == 12.0  # top margin: 30.0 is the top of the plot area
    assert "Step time" in block and "median" in block and 'alt="Step time"' in block


def test_nothing_to_draw_says_so_in_words():
    block = trend_html("Throughput", [], [], empty="the log gives no perf/throughput yet")
    assert "the log gives no perf/throughput yet" in block and "<img" not in block
    nan = trend_html("Throughput", [1, 2], [Line("t", np.array([np.nan, np.nan]), "#000")])
    assert "no data yet" in nan


def test_titles_and_names_from_a_log_are_text_not_markup():
    block = trend_html("<b>x</b>", [1, 2], [Line("<img src=x>", np.array([1.0, 2.0]), "#000")])
    assert "<b>x</b>" not in block and "&lt;img src=x&gt;" in block
