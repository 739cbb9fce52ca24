"""Overview, in the order a user asks: is the run healthy, where does the GPU time go, what is
the top open problem and what to do about it, then the trends."""

from __future__ import annotations

import html

import pandas as pd
import streamlit as st

from dashboards import charts, common
from dashboards.escape import escape_markdown
from dashboards.gpu_time import cause_segments, stacked_bar_html
from dashboards.html_blocks import Stat, inline_html, stat_row_html
from dashboards.sparkline import Line, trend_html
from monitor.api import CAUSE_TEXT, FLAG_CAUSES, cause_line, totals

settings = common.settings()
st.title("Overview")

#: The trend charts, one drawn at a time (the first by default).
TRENDS = ["Step time", "Throughput", "Goodput per step"]
#: What the headline bar rests on.
BAR_CAPTION = ("Every GPU-second of the steps, by cause: productive, or what it was lost to "
               "(the goodput ledger, docs/goodput.md); the same numbers as the banner, "
               "analyze and verlmon_gpu_seconds_total.")


def pending_note(pending: list) -> str:
    """"2 not paging: GPUStraggler (node3 GPU 1) pending: ...": what is open but does not page
    (Markdown, escaped; "" when nothing is)."""
    if not pending:
        return ""
    items = [f"**{escape_markdown(f.kind)}** ({escape_markdown(f.scope_label or 'job')}, since "
             f"{common.fmt_time(f.start)} UTC): {escape_markdown(why)}" for f, why in pending[:5]]
    more = f" and {len(pending) - 5} more" if len(pending) > 5 else ""
    return (f"{len(pending)} not paging (shown apart from the open flags):  \n"
            + "  \n".join(items) + more)


def headline(df: pd.DataFrame, flags: list, head) -> list[Stat]:
    """The row of headline figures: current step, step time against the recent median,
    throughput, open flags and goodput (the headline's: the banner's and the bar's)."""
    share = head.goodput
    goodput = Stat(f"Goodput ({'the run' if head.finished else 'last steps'})",
                   "-" if share is None else f"{share * 100:.0f}%",
                   help=f"Share of the GPU-seconds of {head.span} spent productive; the rest "
                        "is lost by cause (docs/goodput.md).")
    flagged = Stat("Open flags", f"{len(flags)}")
    if df.empty:
        return [Stat("Current step", "-"), Stat("Step time", "-"),
                Stat("Throughput (tok/s/GPU)", "-"), flagged, goodput]
    step = Stat("Current step", f"{int(df.iloc[-1]['step'])}")
    recent = df["total"].dropna().tail(11)
    step_time = Stat("Step time", "-")
    if len(recent):
        last = float(recent.iloc[-1])
        med = float(recent.iloc[:-1].median()) if len(recent) > 1 else last
        step_time = Stat("Step time", common.fmt_duration(last),
                         delta=f"{last - med:+.1f} s vs median",
                         bad=None if abs(last - med) < 0.05 else last > med)
    tp = df["throughput"].dropna()
    throughput = Stat("Throughput (tok/s/GPU)", f"{tp.iloc[-1]:,.0f}" if len(tp) else "-")
    return [step, step_time, throughput, flagged, goodput]


def step_time_html(df: pd.DataFrame, spikes: set[int], window: int = 10) -> str:
    """The step time per step and its rolling median as an SVG trend, the steps a
    ``step_time_spikes`` flag covers marked (the interactive chart is on Steps & phases)."""
    steps = df.dropna(subset=["total"]) if len(df) else df
    if steps.empty:
        return trend_html("Step time", [], [], empty="no steps yet")
    med = steps["total"].rolling(window, min_periods=1).median()
    lines = [Line("step time", steps["total"].to_numpy(float), "#4C78A8"),
             Line(f"rolling median ({window})", med.to_numpy(float), "#555555", dotted=True)]
    marks = {float(s): f"step {s}: spike (step_time_spikes flag)" for s in spikes or ()}
    return trend_html("Step time", steps["step"].to_numpy(float), lines, "seconds", marks)


def throughput_html(df: pd.DataFrame) -> str:
    """Throughput (tokens/s per GPU, as verl reports it) per step as an SVG trend."""
    title = "Throughput (tokens/s per GPU)"
    steps = df.dropna(subset=["throughput"]) if len(df) else df
    if steps.empty:
        return trend_html(title, [], [], empty="the log gives no perf/throughput yet")
    return trend_html(title, steps["step"].to_numpy(float),
                      [Line("throughput", steps["throughput"].to_numpy(float), "#54A24B")],
                      "tokens/s/GPU")


def top_loss(head, flags: list, window_flags: list = ()) -> str:
    """"Top loss: **cause**, N% of the GPU time of the span: what it is. Flagged as `kind`:
    advice" (bold and code for ``inline_html``; "" without a loss): the largest lost segment of
    the bar above it, named as the bar names it. Advice only where an open flag gives it: a
    loss no flag names is information ("no detector flags it"; of a finished run, the flag
    that named it during the run), and while a hang is open no other advice is given (the
    hang's replaces it)."""
    if not head.top_loss:
        return ""
    what = CAUSE_TEXT.get(head.top_loss, ("", ""))[0]
    text = (f"Top loss: **{head.top_loss}**, {head.top_loss_share * 100:.0f}% of the GPU time "
            f"of {head.span}")
    if what:  # drawn by inline_html, which escapes the rest itself
        text += f": {what}"
    if head.flagged_as:
        flag = next((f for f in flags if f.kind == head.flagged_as), None)
        text += f". Flagged as `{head.flagged_as}`"
        if flag is not None and flag.advice:
            text += f": {flag.advice[0]}"
        return text
    if head.hang:
        return text + "."
    if head.finished is not None:
        named = sorted({f.kind for f in window_flags
                        if head.top_loss in FLAG_CAUSES.get(f.kind, ())})
        if named:
            return text + ". Flagged during the run as " + ", ".join(f"`{k}`" for k in named)
    return text + "; no detector flags it."


def causes_markdown(good: dict) -> str:
    """Each cause the ledger booked, largest first, in one line: what it is, what to do."""
    secs = {"productive": good["productive"], **good["lost"], "unattributed": good["unattributed"]}
    total = good["gpu_seconds_total"] or 0.0
    lines = [f"- **{c}** {v / total * 100:.0f}%: {escape_markdown(cause_line(c).partition(': ')[2])}"
             for c, v in sorted(secs.items(), key=lambda kv: -kv[1]) if v > 0 and total > 0]
    return "\n".join(lines)


@common.live_panel(settings, finished_note=False)
def live(start: float, end: float, key: str) -> None:
    """The data panels; only this reruns on the live refresh."""
    df = common.load_steps_frame(key, start, end)
    window_flags = common.load_flags(key, False, start, end)
    flags = common.open_flags(window_flags)
    pending = common.load_pending(key, start, end)
    last_end = float(df["end_time"].iloc[-1]) if len(df) and pd.notna(
        df["end_time"].iloc[-1]) else None
    # 1. is the run healthy? The headline: one computation (monitor/analysis/headline.py)
    head = common.page_headline(key, start, end, window_flags)
    if pending:
        st.info(pending_note(pending), icon=":material/hourglass_top:")
    # the headline figures, the goodput of the span among them
    st.html(stat_row_html(headline(df, flags, head)))

    # 2. where the GPU time went: the ledger's causes, the top loss named as the bar names it
    title, segments = cause_segments(head.shares, head.span, head.goodput, head.top_loss)
    notes = [f'<span style="font-size: 0.875rem; opacity: 0.7;">'
             f"{html.escape(BAR_CAPTION)}</span>"]
    loss = top_loss(head, flags, window_flags)
    if loss:
        notes.append(inline_html(loss))
    st.html(stacked_bar_html(title, segments, tuple(notes)))

    # 3. the top open problem, with what to do (a hang's replaces every other)
    top = head.top_flag
    if top is not None:
        st.subheader("Top open problem")
        with st.container(border=True, key="ov_top_flag"):
            st.markdown(common.flag_card_markdown(top, "What to do"))
        if len(flags) > 1:
            st.page_link("views/flags.py", label=f"{len(flags) - 1} more open flag(s) on the "
                         "Flags page", icon=":material/flag:")

    # 4. trends: one chart at a time (the tab picked, bound to the URL as ``trend``)
    label, tab = common.chosen_tab(TRENDS, "trend")
    with tab:
        # the two step trends are drawn as SVG with the text (no Plotly to load and lay out:
        # the Overview opens at the cost of a plain page); the ledger is a Plotly chart
        if label == "Step time":
            spikes = charts.flagged_steps(window_flags, "step_time_spikes", df)
            st.html(step_time_html(df, spikes))
        elif label == "Throughput":
            st.html(throughput_html(df))
        else:
            led = pd.DataFrame()
            if last_end is not None:
                led = common.load_goodput(key, start, min(end, last_end), last_end,
                                          _steps_end=end)
            if len(led):
                common.chart("goodput_bars", led, key="ov_goodput")
                st.markdown(causes_markdown(totals(led)))
            else:
                st.info("No goodput ledger yet: it needs two finished steps with GPU samples.")
    st.page_link("views/steps.py", label="Seconds and GPU time per phase, per step, on Steps & "
                 "phases", icon=":material/timeline:")
    st.caption(f"Window {common.fmt_time(start)} - {common.fmt_time(end)} UTC "
               f"({settings.window_label}); {len(df)} steps.")


live()
