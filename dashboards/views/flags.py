"""Flags: each flag with its evidence, advice and evidence chart zoomed to its window (drawn
for the newest flag, and for the others when asked), then the history."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import charts, common
from dashboards.sources.alerts import CROSS_NODE_ALERTS
from monitor.api import FLAG_KINDS, SEVERITIES

#: Seconds shown around a flag's window.
PAD_S = 300.0

settings = common.settings()
st.title("Flags")
c1, c2, c3 = st.columns([2, 3, 1])
severities = c1.multiselect("Severity", list(SEVERITIES), default=list(SEVERITIES),
                            key="sev", bind="query-params")
kinds = c2.multiselect("Kind", [*FLAG_KINDS, *CROSS_NODE_ALERTS], default=[], key="kinds",
                       bind="query-params",
                       placeholder="all kinds")
active_only = c3.toggle("Open only", value=False, key="open", bind="query-params")


def history_table(flags: list, now: float) -> pd.DataFrame:
    """One row per flag for the history table (an open flag has lasted until ``now``)."""
    rows = []
    for f in flags:
        end = f.end
        rows.append({"severity": f.severity, "kind": f.kind, "scope": f.scope_label,
                     "start (UTC)": common.fmt_time(f.start), "end (UTC)": common.fmt_time(end),
                     "lasted": common.fmt_duration((now if end is None else end) - f.start),
                     "evidence": f.evidence})
    return pd.DataFrame(rows)


def evidence_chart(flag, key: str, end: float, i: int) -> None:
    """The flag's evidence chart, zoomed to its window with ``PAD_S`` around it."""
    lo = flag.start - PAD_S
    hi = min((flag.end if flag.end is not None else end) + PAD_S, end)
    node = flag.scope.get("node")
    many = node is None and len(common.load_nodes(key)) > 1
    gpu = pd.DataFrame() if many else common.load_gpu(key, lo, hi, 400, node)
    host = common.load_host(key, lo, hi, 400, node)
    fleet = common.load_fleet(key, lo, hi, 400, node)
    steps = common.load_steps_frame(key, flag.start - 4 * PAD_S, hi)
    fig = charts.flag_evidence(flag, gpu, host, steps, fleet, window=(lo, hi))
    # the card's position keys the chart: two nodes may open the same kind in the same second
    st.plotly_chart(fig, key=f"flag_chart_{i}")


def who_is_stuck(key: str, flag, end: float) -> None:
    """The ranks a hang's dump rounds named: node, rank, PID, GPU, collective and frame."""
    who = common.load_hang_culprits(key, flag.start - PAD_S, end)
    with st.container(border=True, key="who_is_stuck"):
        st.subheader("Who is stuck", anchor=False)
        if who.empty:
            st.caption("No process named yet: when a job goes silent the exporters take py-spy "
                       "stacks of its processes (on by default where py-spy is installed) and "
                       "ask the ranks for their Flight Recorder (--fr-dir); see docs/hangs.md.")
            return
        shown = who.drop(columns=["ts"]).rename(columns={"reason": "why"})
        st.dataframe(shown, hide_index=True, key="who_is_stuck_table")


def not_paging(pending: list) -> None:
    """Pending alerts and flags their alert rule holds back: apart from the flags, which are
    open exactly while their alert fires (the Slack messages)."""
    with st.container(border=True, key="flags_pending"):
        st.subheader(f"Not paging ({len(pending)})", anchor=False,
                     help="Open in Prometheus but not firing: a pending alert waits out its "
                          "'for:'; a held-back flag is explained by another alert. Neither "
                          "has gone to Slack.")
        st.dataframe(pd.DataFrame([{"kind": f.kind, "scope": f.scope_label,
                                    "since (UTC)": common.fmt_time(f.start), "why": why,
                                    "evidence": f.evidence} for f, why in pending]),
                     hide_index=True, key="flags_pending_table")


@common.live_panel(settings, finished_note=False)
def live(start: float, end: float, key: str) -> None:
    """The headline's banner, then the flag cards and history; reruns on the live refresh."""
    common.page_headline(key, start, end)
    flags = common.load_flags(key, active_only, None, end)
    flags = [f for f in flags if f.severity in severities and (not kinds or f.kind in kinds)]
    pending = [(f, why) for f, why in common.load_pending(key, None, end)
               if f.severity in severities and (not kinds or f.kind in kinds)]
    if pending:
        not_paging(pending)
    if not flags:
        st.success("No flags match: the detectors found nothing to report here.", icon=":material/check_circle:")
        return
    n_open = sum(1 for f in flags if f.end is None)
    st.caption(f"{len(flags)} flags ({n_open} open), newest first.")
    hangs = [f for f in flags if f.kind == "hang"]
    if hangs:
        who_is_stuck(key, hangs[0], end)
    for i, flag in enumerate(flags):
        with st.container(border=True, key=f"flag_card_{i}"):
            st.markdown(common.flag_card_markdown(flag))
            # the evidence chart of the newest flag is drawn; the others' when their
            # expander is opened (each chart costs the browser about 0.2 s to draw)
            shown = st.expander("Evidence chart", expanded=i == 0, key=f"flag_evidence_{i}",
                                on_change="rerun")
            if shown.open:
                with shown:
                    evidence_chart(flag, key, end, i)
    # the cards above hold every flag; the table of them is drawn when asked
    history = st.expander(f"History: the {len(flags)} flags as a table", key="flag_history_open",
                          on_change="rerun")
    if history.open:
        with history:
            st.dataframe(history_table(flags, end), hide_index=True, key="flag_history")


live()
