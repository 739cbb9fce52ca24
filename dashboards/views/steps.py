"""Steps & phases, one view at a time: the last steps in time with their phases and GPU
activity overlaid, seconds per phase per step, phase statistics, reshard against its median."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import charts, common
from monitor.api import phase_table, phase_timeline

#: The page's views, one drawn at a time (the first by default).
VIEWS = ["Timeline", "Seconds per phase", "Phase statistics", "Reshard"]

settings = common.settings()
st.title("Steps & phases")
last_n = st.slider("Steps to lay out", min_value=2, max_value=50, value=8, key="last_steps",
                   bind="query-params", help="How many of the latest steps the timeline shows.")


@common.live_panel(settings)
def live(start: float, end: float, key: str) -> None:
    """The view picked: timeline, seconds per phase, phase table or reshard; reruns on the
    live refresh."""
    steps = common.load_steps(key, start, end)
    if not steps:
        st.info("No steps in this window yet.")
        return
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
