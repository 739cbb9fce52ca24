"""Overview, in the order a user asks: is the run healthy, where does the GPU time go, what is
the top open problem and what to do about it, then the trends."""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import streamlit as st

from dashboards import charts, common
from dashboards.escape import escape_markdown
from dashboards.gpu_time import gpu_time_segments, stacked_bar_html
from dashboards.html_blocks import Stat, inline_html, stat_row_html
from dashboards.sparkline import Line, trend_html
from monitor.api import CAUSE_TEXT, FLAG_CAUSES, SEVERITIES, cause_line, rank_problems, totals

settings = common.settings()
st.title("Overview")

#: The trend charts, one drawn at a time (the first by default).
TRENDS = ["Step time", "Throughput", "Goodput per step"]


def top_flag(flags: list):
    """The open flag to act on first: most severe, a cause before the flags it explains (the
    straggler before its waiting peers), then the most recent (``common.rank_flags``)."""
    return common.rank_flags(flags)[0] if flags else None


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


def headline(df: pd.DataFrame, flags: list, good: dict | None) -> list[Stat]:
    """The row of headline figures: current step, step time against the recent median,
    throughput, open flags and goodput."""
    share = None if not good else good["goodput_share"]
    goodput = Stat("Goodput (last steps)", "-" if share is None else f"{share * 100:.0f}%",
                   help="Share of the GPU-seconds of the last steps spent productive; the rest "
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


def counter_summary(key: str, recent: pd.DataFrame, last_end: float) -> pd.DataFrame:
    """Per phase over the last steps from the exporters' per-phase counters (Prometheus: every
    1 s sample of theirs, where the scraped gauges hold one every 15 s); empty from a store."""
    if common.get_source().kind != "prometheus" or recent.empty:
        return pd.DataFrame()
    first = recent.iloc[0]
    begin = float(first["end_time"]) - float(first["total"] if pd.notna(first["total"]) else 0)
    return common.load_phase_activity(key, begin, float(last_end))


def top_loss(good: dict | None, flags: list) -> str:
    """"Top loss: **cause**, N% of the GPU-seconds (what it is; what to do) - flagged as
    `kind`: advice" (bold and code for ``inline_html``; "" without a loss). ``restarts`` is named only where the
    ledger booked some (an exporter that never restarted has none)."""
    if not good:
        return ""
    lost = sorted(((c, v) for c, v in good["lost"].items() if v > 0), key=lambda kv: -kv[1])
    total = good["gpu_seconds_total"] or 0.0
    if not lost or total <= 0:
        return ""
    cause, secs = lost[0]
    what, todo = CAUSE_TEXT.get(cause, ("", ""))
    text = f"Top loss: **{cause}**, {secs / total * 100:.0f}% of the GPU-seconds"
    if what:  # drawn by inline_html, which escapes the rest itself
        text += f" ({what}" + (f"; {todo})" if todo else ")")
    named = [f for f in flags if f.kind in FLAG_KINDS_OF.get(cause, ())]
    if named:
        f = top_flag(named)
        text += f" - flagged as `{f.kind}`"
        if f.advice:
            text += f": {f.advice[0]}"
    return text


#: The flag kinds that name each ledger cause (``run_analysis.FLAG_CAUSES`` turned round).
FLAG_KINDS_OF: dict[str, tuple[str, ...]] = {}
for _kind, _causes in FLAG_CAUSES.items():
    for _cause in _causes:
        FLAG_KINDS_OF[_cause] = (*FLAG_KINDS_OF.get(_cause, ()), _kind)


def causes_markdown(good: dict) -> str:
    """Each cause the ledger booked, largest first, in one line: what it is, what to do."""
    secs = {"productive": good["productive"], **good["lost"], "unattributed": good["unattributed"]}
    total = good["gpu_seconds_total"] or 0.0
    lines = [f"- **{c}** {v / total * 100:.0f}%: {escape_markdown(cause_line(c).partition(': ')[2])}"
             for c, v in sorted(secs.items(), key=lambda kv: -kv[1]) if v > 0 and total > 0]
    return "\n".join(lines)


def health_banner(flags: list, good: dict | None, healthy_share: float,
                  top: dict | None = None) -> tuple[str, str]:
    """The banner's kind (``success``, ``warning``, ``error``) and words: "Healthy" only with
    no open flag and a goodput of at least ``healthy_share`` (the SM activity the
    ``low_utilization`` detector calls healthy), else what is open or what the GPU time is
    lost to."""
    if flags:
        by_sev = {s: sum(1 for f in flags if f.severity == s) for s in reversed(SEVERITIES)}
        words = ", ".join(f"{n} {s}" for s, n in by_sev.items() if n)
        worst = "error" if any(f.severity == "critical" for f in flags) else "warning"
        text = f"Needs attention: {len(flags)} open flag(s) ({words})."
        if top is not None:
            text = text[:-1] + f"; top problem: {top['flag'].kind}"
            if top.get("share"):
                text += f", {top['share'] * 100:.0f}% of the GPU time of the last steps"
            text += "."
        return worst, text
    share = None if not good else good.get("goodput_share")
    if share is not None and share < healthy_share:
        lost = sorted(((c, v) for c, v in good["lost"].items() if v > 0), key=lambda kv: -kv[1])
        top = f"; the largest loss is {lost[0][0]}" if lost else ""
        return "warning", (f"No open flag, but goodput is {share * 100:.0f}% of the GPU time, "
                           f"under the {healthy_share * 100:.0f}% the low_utilization detector "
                           f"calls healthy{top} (below).")
    return "success", "Healthy: no open flag; every detector is quiet."


def top_problem(flags: list, led: pd.DataFrame) -> dict | None:
    """The open flag to act on first, as ``analyze`` and wandb name it (a ``rank_problems``
    entry: ``flag``, ``gpu_seconds``, ``share``): the most severe, then the one that costs the
    most GPU time in the ledger (with the flags it explains), else :func:`top_flag`'s order."""
    if not flags:
        return None
    if not len(led):
        return {"flag": top_flag(flags), "gpu_seconds": None, "share": None}
    return rank_problems(flags, led, common.run_config().section("suppress"))[0]


@common.live_panel(settings)
def live(start: float, end: float, key: str) -> None:
    """The data panels; only this reruns on the live refresh."""
    df = common.load_steps_frame(key, start, end)
    window_flags = common.load_flags(key, False, start, end)
    flags = common.open_flags(window_flags)
    pending = common.load_pending(key, start, end)
    n_steps = min(len(df), common.ATTRIB_STEPS)
    # the last steps' figures are read up to the last step's end: samples after it change
    # nothing, so a refresh without a new step reuses the cached answers
    last_end = (float(df["end_time"].iloc[-1])
                if n_steps and pd.notna(df["end_time"].iloc[-1]) else None)
    led = pd.DataFrame()
    if last_end is not None:
        led = common.load_goodput(key, start, min(end, last_end), last_end, _steps_end=end)
    good = totals(led) if len(led) else None
    ranked = top_problem(flags, led)
    top = None if ranked is None else ranked["flag"]
    # 1. is the run healthy?
    healthy = common.run_config().get_float("low_utilization.threshold", 70.0) / 100.0
    kind, words = health_banner(flags, good, healthy, ranked)
    icon = ":material/check_circle:" if kind == "success" else ":material/warning:"
    getattr(st, kind)(words, icon=icon)
    if pending:
        st.info(pending_note(pending), icon=":material/hourglass_top:")
    # the headline figures, the goodput of the last steps among them
    st.html(stat_row_html(headline(df, flags, good)))

    # 2. where the GPU time goes
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
    loss = top_loss(good, flags)
    if loss:
        notes.append(inline_html(loss))
    st.html(stacked_bar_html(title, segments, tuple(notes)))

    # 3. the top open problem, with what to do
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
        elif good:
            common.chart("goodput_bars", led, key="ov_goodput")
            st.markdown(causes_markdown(good))
        else:
            st.info("No goodput ledger yet: it needs two finished steps with GPU samples.")
    st.page_link("views/steps.py", label="Seconds per phase, per step, on Steps & phases",
                 icon=":material/timeline:")
    st.caption(f"Window {common.fmt_time(start)} - {common.fmt_time(end)} UTC "
               f"({settings.window_label}); {len(df)} steps.")


live()
