"""Overview, in the order a user asks: is the run healthy, where does the GPU time go, what is
the top open problem and what to do about it, then the trends."""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from dashboards import charts, common
from monitor.analysis.goodput import totals
from monitor.records import SEVERITIES

settings = common.settings()
st.title("Overview")

#: Severity rank, most urgent first.
_RANK = {s: i for i, s in enumerate(reversed(SEVERITIES))}


def top_flag(flags: list):
    """The open flag to act on first: most severe, then the most recent."""
    return min(flags, key=lambda f: (_RANK.get(f.severity, 99), -f.start)) if flags else None


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
        util = {str(r.phase): float(r.util_mean) for r in summary.itertuples()}
    return seconds, util


@common.live_panel(settings)
def live(start: float, end: float, key: str) -> None:
    """The data panels; only this reruns on the live refresh."""
    df = common.load_steps_frame(key, start, end)
    window_flags = common.load_flags(key, False, start, end)
    flags = common.open_flags(window_flags)
    top = top_flag(flags)
    # 1. is the run healthy?
    if top is None:
        st.success("Healthy: no open flag; every detector is quiet.", icon=":material/check_circle:")
    else:
        by_sev = {s: sum(1 for f in flags if f.severity == s) for s in reversed(SEVERITIES)}
        words = ", ".join(f"{n} {s}" for s, n in by_sev.items() if n)
        box = st.error if top.severity == "critical" else st.warning
        box(f"Needs attention: {len(flags)} open flag(s) ({words}).", icon=":material/warning:")
    # the goodput ledger of the last steps: the headline number, then its bar chart below
    n_steps = min(len(df), common.ATTRIB_STEPS)
    led = pd.DataFrame()
    if n_steps and pd.notna(df["end_time"].iloc[-1]):
        last_end = float(df["end_time"].iloc[-1])
        led = common.load_goodput(key, start, min(end, last_end), last_end)
    good = totals(led) if len(led) else None
    c1, c2, c3, c4, c5 = st.columns(5)
    c5.metric("Goodput (last steps)", "-" if not good or good["goodput_share"] is None
              else f"{good['goodput_share'] * 100:.0f}%",
              help="Share of the GPU-seconds of the last steps spent productive; the rest is "
                   "lost by cause (docs/goodput.md).")
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
    c4.metric("Open flags", f"{len(flags)}")

    # 2. where the GPU time goes
    summary = pd.DataFrame()
    if n_steps and pd.notna(df["end_time"].iloc[-1]):
        last_end = float(df["end_time"].iloc[-1])
        # up to the last step's end: samples after it change nothing, so a refresh without a
        # new step reuses the cached attribution
        summary = common.load_attribution(key, start, min(end, last_end), last_end, fleet=True)
    seconds, util = gpu_time(df, summary, n_steps) if n_steps else ({}, {})
    step_util = None
    if n_steps and pd.notna(df["end_time"].iloc[-1]):
        last_end = float(df["end_time"].iloc[-1])
        step_util = common.load_steps_util(key, start, min(end, last_end), last_end)
    common.chart("gpu_time_bar", seconds, util, step_util, key="ov_gpu_time")
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
    st.caption(caption)
    if good:
        common.chart("goodput_bars", led, key="ov_goodput")
        lost = sorted(good["lost"].items(), key=lambda kv: -kv[1])
        total = good["gpu_seconds_total"] or 0.0
        if lost and total > 0 and lost[0][1] > 0:
            cause, secs = lost[0]
            text = f"Top loss: **{cause}**, {secs / total * 100:.0f}% of the GPU-seconds"
            named = [f for f in flags if f.kind in common.CAUSE_FLAGS.get(cause, ())]
            if named:
                f = top_flag(named)
                text += f" - flagged as `{f.kind}`"
                if f.advice:
                    text += f": {f.advice[0]}"
            st.markdown(text)

    # 3. the top open problem, with what to do
    if top is not None:
        st.subheader("Top open problem")
        with st.container(border=True, key="ov_top_flag"):
            color = {"critical": "red", "warning": "orange"}.get(top.severity, "blue")
            st.markdown(f":{color}-badge[{top.severity.upper()}] "
                        f"**{common.flag_title(top, severity=False)}**")
            st.markdown(f"**Evidence:** {top.evidence}" if top.evidence else "_no evidence_")
            if top.advice:
                st.markdown("**What to do:**\n" + "\n".join(f"- {a}" for a in top.advice))
        if len(flags) > 1:
            st.page_link("views/flags.py", label=f"{len(flags) - 1} more open flag(s) on the "
                         "Flags page", icon=":material/flag:")

    # 4. trends
    # (seconds per phase, per step, is on the Steps page: one chart fewer to draw here)
    left, right = st.columns(2)
    spikes = charts.flagged_steps(window_flags, "step_time_spikes", df)
    with left:
        common.chart("step_time_trend", df, flagged=spikes, key="ov_step_time")
    with right:
        common.chart("throughput_trend", df, key="ov_throughput")
    st.page_link("views/steps.py", label="Seconds per phase, per step, on Steps & phases",
                 icon=":material/timeline:")
    st.caption(f"Window {common.fmt_time(start)} - {common.fmt_time(end)} UTC "
               f"({settings.window_label}); {len(df)} steps.")


live()
