"""Steps & phases: where the GPU time of the mean step goes, phase by phase (its share of the
step and the GPUs' utilization in it), then one view at a time: the last steps in time with
their phases and GPU activity overlaid, seconds per phase per step, phase statistics, reshard
against its median."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import streamlit as st

from dashboards import charts, common
from dashboards.gpu_time import gpu_time_segments, stacked_bar_html
from monitor.api import phase_table, phase_timeline

#: The page's views, one drawn at a time (the first by default).
VIEWS = ["Timeline", "Seconds per phase", "Phase statistics", "Reshard"]

settings = common.settings()
st.title("Steps & phases")
last_n = st.slider("Steps to lay out", min_value=2, max_value=50, value=8, key="last_steps",
                   bind="query-params", help="How many of the latest steps the timeline shows.")


def gpu_time(df: pd.DataFrame, summary: pd.DataFrame, n_steps: int) -> tuple[dict, dict]:
    """Mean seconds per phase over the last ``n_steps`` steps and the GPUs' mean utilization
    in each (NaN where the attribution withheld it)."""
    recent = df.tail(n_steps)
    phases = charts.phase_columns(recent)
    seconds = {p: float(recent[p].mean()) for p in phases}
    known = sum(v for v in seconds.values() if np.isfinite(v))
    total = float(recent["total"].mean()) if recent["total"].notna().any() else known
    if total - known > 1e-6 and "other" not in seconds:
        seconds["other"] = total - known
    util: dict[str, float] = {}
    if summary is not None and len(summary):
        # the mean GPU: per-GPU rows (a store, as analyze reads it) or one fleet row per phase
        means = summary.groupby("phase", sort=False)["util_mean"].mean()
        util = {str(p): float(v) for p, v in means.items()}
    return seconds, util


def gpu_time_caption(n_steps: int, summary: pd.DataFrame, step_util: float | None) -> str:
    """What the GPU-time bar rests on, and how the short phases got their busy share."""
    caption = (f"Mean of the last {n_steps} steps: each phase's share of the step times the "
               "GPUs' mean utilization in it; the rest of the step the GPUs sat idle.")
    held = common.withheld_text(summary)
    if held:
        caption += (f" Short phases, with the samples wholly inside them over the steps: "
                    f"{held}; fewer than {common.phase_min_samples()} each, so they are not "
                    "measured one by one: ")
        caption += ("their busy share together is the steps' mean utilization "
                    f"({step_util:.0f}%) less the measured phases'." if step_util is not None
                    else "no utilization sample fell inside the steps.")
    return caption


def counter_summary(key: str, recent: pd.DataFrame, last_end: float) -> pd.DataFrame:
    """Per phase over the last steps from the exporters' per-phase counters (Prometheus: every
    1 s sample of theirs, where the scraped gauges hold one every 15 s); empty from a store."""
    if common.get_source().kind != "prometheus" or recent.empty:
        return pd.DataFrame()
    first = recent.iloc[0]
    begin = float(first["end_time"]) - float(first["total"] if pd.notna(first["total"]) else 0)
    return common.load_phase_activity(key, begin, float(last_end))


def phase_bar(key: str, start: float, end: float, df: pd.DataFrame) -> None:
    """The mean step's GPU time, phase by phase: the phase's share of the step times the GPUs'
    utilization in it, the rest idle (per-phase counters from Prometheus, every sample from a
    store)."""
    n_steps = min(len(df), common.ATTRIB_STEPS)
    last_end = (float(df["end_time"].iloc[-1])
                if n_steps and pd.notna(df["end_time"].iloc[-1]) else None)
    summary = pd.DataFrame()
    step_util = None
    if last_end is not None:
        summary = counter_summary(key, df.tail(n_steps), last_end)
        if summary.empty:  # a store (every GPU's samples, as analyze reads its export), or
            # exporters without per-phase counters (the mean across GPUs from Prometheus)
            fleet = common.get_source().kind == "prometheus"
            summary = common.load_attribution(key, start, min(end, last_end), last_end,
                                              fleet=fleet, _steps_end=end)
        if summary.empty or (summary["withheld"] != "").any():
            step_util = common.load_steps_util(key, start, min(end, last_end), last_end,
                                               _steps_end=end)
    seconds, util = gpu_time(df, summary, n_steps) if n_steps else ({}, {})
    title, segments = gpu_time_segments(seconds, util, step_util)
    notes = [f'<span style="font-size: 0.875rem; opacity: 0.7;">'
             f"{html.escape(gpu_time_caption(n_steps, summary, step_util))}</span>"]
    st.html(stacked_bar_html(title, segments, tuple(notes)))


@common.live_panel(settings)
def live(start: float, end: float, key: str) -> None:
    """The view picked: timeline, seconds per phase, phase table or reshard; reruns on the
    live refresh."""
    steps = common.load_steps(key, start, end)
    if not steps:
        st.info("No steps in this window yet.")
        return
    phase_bar(key, start, end, common.load_steps_frame(key, start, end))
    # one chart at a time: the view picked (bound to the URL as ``steps_view``)
    label, tab = common.chosen_tab(VIEWS, "steps_view")
    with tab:
        if label == "Timeline":
            timeline = phase_timeline(steps[-last_n:])
            if not timeline.empty:
                t0, t1 = float(timeline["start"].min()), float(timeline["end"].max())
                fleet = common.load_fleet(key, t0, t1, common.MAX_POINTS)
            else:
                fleet = pd.DataFrame()
            st.plotly_chart(charts.step_timeline(timeline, fleet), key="steps_timeline")
        elif label == "Seconds per phase":
            common.chart("phase_stacked_bars", common.load_steps_frame(key, start, end),
                         key="steps_phases")
        elif label == "Phase statistics":
            phase_statistics(steps)
        else:
            df = common.load_steps_frame(key, start, end)
            flagged = charts.flagged_steps(common.load_flags(key, False, start, end),
                                           "reshard_spike", df)
            st.plotly_chart(charts.reshard_vs_median(df, flagged=flagged), key="steps_reshard")


def phase_statistics(steps: list) -> None:
    """Per phase over the window: mean, median, p95 and max seconds, total and share."""
    stats = phase_table(steps)
    stats = stats.rename_axis("phase").reset_index()
    if "share" in stats.columns:
        stats["share"] = 100 * stats["share"]
    secs = {c: st.column_config.NumberColumn(f"{c} (s)", format="%.2f")
            for c in ("mean", "p50", "p95", "max")}
    st.dataframe(stats, hide_index=True, key="steps_phase_table",
                 column_config={"phase": st.column_config.TextColumn("phase"),
                                "steps": st.column_config.NumberColumn("steps", format="%d"),
                                **secs,
                                "sum": st.column_config.NumberColumn("total (s)", format="%.0f"),
                                "share": st.column_config.NumberColumn("share of step %",
                                                                       format="%.1f")})


live()
