"""The Overview's GPU-time bar: its segments and the HTML that draws them."""

from __future__ import annotations

import re

import pytest

from dashboards.gpu_time import gpu_time_segments, stacked_bar_html


def test_short_phases_get_the_steps_leftover_busy_time() -> None:
    # gen 60% of the step at 80% busy, update 20% at 90%; reward + adv (20%) too short to
    # measure. The GPUs were 70% busy over the whole steps: 48 + 18 = 66 measured, so the
    # short phases were busy 4 points of their 20, and the step idle 30%.
    seconds = {"gen": 6.0, "reward": 1.0, "adv": 1.0, "update_actor": 2.0}
    util = {"gen": 80.0, "update_actor": 90.0}
    title, segments = gpu_time_segments(seconds, util, step_util=70.0)
    parts = {s.name: s.share for s in segments}
    assert parts["gen"] == pytest.approx(48.0)
    assert parts["short phases (20% of the step, ~20% busy)"] == pytest.approx(4.0)
    assert parts["idle (30%)"] == pytest.approx(30.0)
    assert sum(parts.values()) == pytest.approx(100.0)
    assert title.endswith("GPUs idle 30% of the step")
    # without the steps' utilization the block says it is not measured
    names = [s.name for s in gpu_time_segments(seconds, util)[1]]
    assert "util n/a (20%)" in names


def test_no_phase_timings_draws_no_bar() -> None:
    title, segments = gpu_time_segments({}, {})
    assert segments == [] and "no phase timings yet" in title
    assert "verlmon-gpu-time-bar" not in stacked_bar_html(title, segments)


def test_the_html_bar_has_one_block_per_segment_sized_by_its_share() -> None:
    title, segments = gpu_time_segments({"gen": 3.0, "update_actor": 1.0},
                                        {"gen": 100.0, "update_actor": 50.0})
    page = stacked_bar_html(title, segments)
    bar = page[page.index("verlmon-gpu-time-bar"):]
    widths = [float(w) for w in re.findall(r'<div title="[^"]*" style="width: ([0-9.]+)%', bar)]
    assert widths == pytest.approx([75.0, 12.5, 12.5])
    # hovering explains each block; the legend names each with its share
    assert 'title="update_actor: 25% of the step, GPUs 50% busy in it"' in page
    assert "gen 75%" in page and "idle (12%)" in page


def test_names_are_escaped() -> None:
    _, segments = gpu_time_segments({"<b>x</b>": 1.0}, {"<b>x</b>": 50.0})
    page = stacked_bar_html("t", segments)
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page
