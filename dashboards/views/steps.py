"""Steps & phases: the last steps in time with their phases, GPU activity overlaid; reshard."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import charts, common
from monitor.analysis.attribution import phase_timeline
from monitor.analysis.summary import phase_table

settings = common.settings()
st.title("Steps & phases")
last_n = st.slider("Steps to lay out", min_value=2, max_value=50, value=8, key="last_steps",
                   bind="query-params", help="How many of the latest steps the timeline shows.")


@common.live_panel(settings)
def live(start: float, end: float, key: str) -> None:
    """Timeline, reshard chart and phase table; reruns on the live refresh."""
    steps = common.load_steps(key, start, end)
    if not steps:
        st.info("No steps in this window yet.")
        return
    recent = steps[-last_n:]
    timeline = phase_timeline(recent)
    if not timeline.empty:
        t0, t1 = float(timeline["start"].min()), float(timeline["end"].max())
        fleet = common.load_fleet(key, t0, t1, common.MAX_POINTS)
    else:
        fleet = pd.DataFrame()
    st.plotly_chart(charts.step_timeline(timeline, fleet), key="steps_timeline")
    df = common.load_steps_frame(key, start, end)
    flagged = charts.flagged_steps(common.load_flags(key, False, start, end), "reshard_spike", df)
    st.plotly_chart(charts.reshard_vs_median(df, flagged=flagged), key="steps_reshard")
    common.chart("phase_stacked_bars", df, key="steps_phases")
    st.subheader("Phase statistics over the window")
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
