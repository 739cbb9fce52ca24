"""Headline figures and inline Markdown drawn as one HTML block."""

from __future__ import annotations

from dashboards.html_blocks import (
    BAD_COLOR,
    GOOD_COLOR,
    Stat,
    inline_html,
    stat_row_html,
    stat_values,
)


def test_a_stat_row_shows_each_label_with_its_value() -> None:
    block = stat_row_html([Stat("Current step", "412"), Stat("Goodput (last steps)", "63%",
                                                             help="share of GPU-seconds")])
    assert stat_values(block) == {"Current step": "412", "Goodput (last steps)": "63%"}
    assert 'title="share of GPU-seconds"' in block


def test_a_change_for_the_worse_is_red_and_for_the_better_green() -> None:
    worse = stat_row_html([Stat("Step time", "31.0 s", delta="+4.2 s vs median", bad=True)])
    better = stat_row_html([Stat("Step time", "25.0 s", delta="-1.8 s vs median", bad=False)])
    flat = stat_row_html([Stat("Step time", "26.8 s", delta="+0.0 s vs median")])
    assert BAD_COLOR in worse and "+4.2 s vs median" in worse
    assert GOOD_COLOR in better and BAD_COLOR not in better
    assert BAD_COLOR not in flat and GOOD_COLOR not in flat


def test_labels_and_values_are_escaped() -> None:
    block = stat_row_html([Stat("<script>", "a&b")])
    assert "<script>" not in block
    assert stat_values(block) == {"<script>": "a&b"}


def test_inline_markdown_bold_and_code_become_html_and_the_rest_is_escaped() -> None:
    text = "Top loss: **data_loading**, 31% - flagged as `io_starvation`: raise <workers>"
    assert inline_html(text) == ("Top loss: <b>data_loading</b>, 31% - flagged as "
                                 "<code>io_starvation</code>: raise &lt;workers&gt;")
