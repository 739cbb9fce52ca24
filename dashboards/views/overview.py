"""Overview: healthy at a glance: current step, step time, throughput, flags, phase split."""

from __future__ import annotations

import numpy as np
import streamlit as st

from dashboards import charts, common
from monitor.records import SEVERITIES

settings = common.settings()
st.title("Overview")


@common.live_panel(settings)
def live(start: float, end: float, key: str) -> None:
    """The data panels; only this reruns on the live refresh."""
    df = common.load_steps_frame(key, start, end)
    flags = common.load_flags(key, True)
    fleet = common.load_fleet(key, max(start, end - 300), end, 300)
    c1, c2, c3, c4, c5 = st.columns(5)
    if df.empty:
        c1.metric("Current step", "-")
        c2.metric("Step time", "-")
        c3.metric("Throughput (tok/s/GPU)", "-")
    else:
        last = df.iloc[-1]
        c1.metric("Current step", f"{int(last['step'])}")
        recent = df["total"].dropna().tail(11)
        if len(recent):
            med = float(recent.iloc[:-1].median()) if len(recent) > 1 else float(recent.iloc[-1])
            c2.metric("Step time", common.fmt_duration(recent.iloc[-1]),
                      delta=f"{recent.iloc[-1] - med:+.1f} s vs median", delta_color="inverse")
        else:
            c2.metric("Step time", "-")
        tp = df["throughput"].dropna()
        c3.metric("Throughput (tok/s/GPU)", f"{tp.iloc[-1]:,.0f}" if len(tp) else "-")
    util = float(np.nanmean(fleet["util_mean"])) if not fleet.empty else float("nan")
    c4.metric("GPU util (last 5 min)", "-" if np.isnan(util) else f"{util:.0f}%")
    by_sev = {s: sum(1 for f in flags if f.severity == s) for s in SEVERITIES}
    c5.metric("Active flags", f"{len(flags)}",
              help=", ".join(f"{n} {s}" for s, n in by_sev.items()))

    if flags:
        st.subheader("Active flags")
        for sev in reversed(SEVERITIES):
            for flag in [f for f in flags if f.severity == sev]:
                box = {"critical": st.error, "warning": st.warning}.get(sev, st.info)
                box(f"**{common.flag_title(flag)}**  \n{flag.evidence}")
    else:
        st.success("No active flags: every detector is quiet.", icon=":material/check_circle:")

    left, right = st.columns(2)
    left.plotly_chart(charts.step_time_trend(df), key="ov_step_time", width="stretch")
    right.plotly_chart(charts.throughput_trend(df), key="ov_throughput", width="stretch")
    st.plotly_chart(charts.phase_stacked_bars(df), key="ov_phases", width="stretch")
    st.caption(f"Window {common.fmt_time(start)} - {common.fmt_time(end)} UTC "
               f"({settings.window_label}); {len(df)} steps.")


live()
