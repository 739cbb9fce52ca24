"""Job: the job across its attempts. Each start and end (``verl-monitor run``'s record, a resume
line), where each attempt's wall time went, the job's ETTR, what each failure cost, what
``--on-hang`` did, and how often to save a checkpoint from the job's own numbers. It reads the
run store's whole history, not the window: a job's attempts span days."""

from __future__ import annotations

import time

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from dashboards import common
from dashboards.escape import escape_markdown
from monitor.api import BUCKET_TEXT, BUCKETS, RunStore, cadence, job_history, job_ledger

#: Colours of the buckets: the job's work green, the losses warm, the waits grey.
COLOURS = {"productive": "#2e7d32", "redone": "#ef6c00", "overhead": "#90a4ae",
           "checkpoint": "#5c6bc0", "validation": "#7e57c2", "between_steps": "#b0bec5",
           "hang": "#c62828", "crash_loss": "#d84315", "shutdown": "#cfd8dc",
           "after_last_step": "#eceff1", "between_attempts": "#e0e0e0"}

settings = common.settings()
st.title("Job")
st.caption("Every attempt of the job (each start under verl-monitor run, each resume line), "
           "from the run store's whole history; ETTR = productive step time over the job's "
           "wall time (docs/attempts.md).")
mtbf_h = st.number_input("Mean time between failures (hours) for the checkpoint cadence; 0: "
                         "the failures seen", min_value=0.0, value=0.0, step=1.0, key="mtbf",
                         bind="query-params")


@st.cache_data(ttl=30, show_spinner=False, max_entries=8)
def load_job(path: str, stamp: tuple, mtbf_s: float | None) -> tuple[dict, dict, list]:
    """The ledger, the cadence and the ``--on-hang`` actions from the store (cached until the
    store is written)."""
    with RunStore(path, create=False) as store:
        steps, events, flags = job_history(store)
        actions = [(e.time, e.message, bool((e.data or {}).get("acted")))
                   for e in store.events(kind="hang_action")]
        job_config = store.meta().get("job_config")
    ledger = job_ledger(steps, events, flags, running=True)
    cad = cadence(ledger, steps, job_config if isinstance(job_config, dict) else None,
                  mtbf_s=mtbf_s)
    return ledger, cad, actions


def bars(ledger: dict) -> go.Figure:
    """One bar an attempt (and the waits between them), split by bucket, in minutes."""
    rows = [(f"#{a['attempt']} {a['ended_by']}", a["seconds"]) for a in ledger["attempts"]]
    rows.append(("between attempts", {"between_attempts": ledger["seconds"]["between_attempts"]}))
    fig = go.Figure()
    for bucket in (*BUCKETS, "between_attempts"):
        fig.add_bar(name=bucket, orientation="h", y=[r[0] for r in rows],
                    x=[r[1].get(bucket, 0.0) / 60.0 for r in rows],
                    marker_color=COLOURS[bucket], hovertext=BUCKET_TEXT[bucket])
    fig.update_layout(barmode="stack", height=120 + 36 * len(rows), xaxis_title="minutes",
                      yaxis={"autorange": "reversed"}, margin={"l": 10, "r": 10, "t": 30},
                      title="Where each attempt's wall time went", legend_orientation="h")
    return fig


def attempts_table(ledger: dict) -> pd.DataFrame:
    """One row per attempt."""
    rows = []
    for a in ledger["attempts"]:
        steps = "-" if a["first_step"] is None else f"{a['first_step']}-{a['last_step']}"
        rows.append({"attempt": a["attempt"],
                     "start (UTC)": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(a["start"])),
                     "wall": common.fmt_duration(a["wall"]), "steps": steps,
                     "redone": a["redone_steps"], "resumed from": a["resumed_from"],
                     "ended by": a["ended_by"], "how": a["detail"],
                     **{b: round(a["seconds"][b], 1) for b in BUCKETS}})
    return pd.DataFrame(rows)


def headline(ledger: dict) -> None:
    """ETTR and the job's counts."""
    ettr = ledger.get("ettr")
    c = st.columns(6)
    c[0].metric("ETTR", "unknown" if ettr is None else f"{ettr * 100:.1f}%",
                help="productive step time / the job's wall time, all attempts")
    c[1].metric("Wall time", common.fmt_duration(ledger["wall"]))
    c[2].metric("Attempts", str(len(ledger["attempts"])))
    c[3].metric("Failures", str(ledger["failures"]))
    c[4].metric("Steps redone", str(ledger["steps_redone"]))
    c[5].metric("Checkpoint saves", str(ledger["saves"]))
    for p in ledger.get("premises") or []:
        st.caption(escape_markdown(p))


@common.live_panel(settings)
def live(start: float, end: float, key: str) -> None:
    """The job view from the store; a Prometheus source has only the job's counters."""
    cfg = common.source_config()
    if not cfg.store or cfg.prometheus:
        st.info("The job view reads a run store (verl-monitor dashboard --store run.db). With "
                "Prometheus, the exporters serve the job's ledger as verlmon_job_seconds_total"
                "{bucket}, verlmon_job_ettr_ratio and the other verlmon_job_* series.")
        return
    ledger, cad, actions = load_job(cfg.store, common.store_stamp(), mtbf_h * 3600.0 or None)
    if not ledger["attempts"]:
        st.info("No attempt in the store yet: no step and no start recorded.")
        return
    headline(ledger)
    st.plotly_chart(bars(ledger), key="job_bars")
    st.dataframe(attempts_table(ledger), hide_index=True, key="job_attempts", width="stretch")
    for c in ledger["failure_costs"]:
        back = "" if c["back"] else " so far (no later attempt got back there)"
        st.markdown(escape_markdown(
            f"Failure #{c['attempt']} ({c['ended_by']}) cost {common.fmt_duration(c['seconds'])}"
            f"{back}: from its last step until step {c['step']} was done again."))
    st.subheader("Checkpoint cadence", anchor=False)
    if cad.get("advice"):
        st.info(escape_markdown(cad["advice"]), icon=":material/save:")
        st.caption(escape_markdown(f"Save cost from {cad['save_cost_source']} "
                                   f"({cad['saves_seen']} save(s)); MTBF from "
                                   f"{cad['mtbf_source']}."))
    else:
        st.caption(escape_markdown("No cadence advice: " + "; ".join(cad.get("missing") or [])))
    if actions:
        st.subheader("On a hang (--on-hang)", anchor=False)
        for t, words, acted in actions:
            say = st.warning if acted else st.caption
            say(escape_markdown(f"{common.fmt_time(t)} UTC: {words}"))


live()
