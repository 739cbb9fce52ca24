"""Rollout: the vLLM / SGLang servers behind verl's agent loop, one view at a time: KV cache use
per server, requests running / waiting / paused, preemptions, the generation tail, latency."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from dashboards import common

#: The page's views, one drawn at a time (the first by default).
VIEWS = ["KV cache", "Requests", "Preemptions", "Tail", "Latency"]

settings = common.settings()
st.title("Rollout")


def headline(rollout: pd.DataFrame) -> None:
    """Servers, KV cache use, requests waiting and preemptions over the window."""
    awake = rollout[rollout["sleeping"].fillna(0) < 0.5]
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("Engine servers", f"{rollout['server'].nunique()}",
              help="vLLM / SGLang servers reporting in this window")
    kv = awake["kv_cache_usage"].dropna()
    c2.metric("KV cache (awake, mean / max)",
              f"{100 * kv.mean():.0f}% / {100 * kv.max():.0f}%" if len(kv) else "-",
              help="Share of the KV cache in use while the engines are awake; near 100% the "
                   "engine preempts requests")
    waiting = awake.groupby("ts")["waiting"].sum(min_count=1).dropna()
    c3.metric("Requests waiting (pool mean)", f"{waiting.mean():.1f}" if len(waiting) else "-")
    pre = rollout.groupby("ts")["preemptions_per_s"].sum(min_count=1).dropna()
    c4.metric("Preemptions (pool)", f"{pre.mean():.2f}/s" if len(pre) else "-",
              help="Requests the engines evicted for lack of KV cache (SGLang: retractions)")


@common.live_panel(settings)
def live(start: float, end: float, key: str) -> None:
    """The view picked; reruns on the live refresh."""
    rollout = common.load_rollout(key, start, end)
    if rollout.empty:
        st.info("No rollout-engine data in this window. The exporter scrapes verl's vLLM / "
                "SGLang servers when given `--rollout-server URL` (server-mode rollout, "
                "`actor_rollout_ref.rollout.mode: async`).")
        return
    headline(rollout)
    # one chart at a time: the view picked (bound to the URL as ``rollout_view``)
    label, tab = common.chosen_tab(VIEWS, "rollout_view")
    with tab:
        if label == "KV cache":
            common.chart("rollout_by_server", rollout, "kv_cache_usage",
                         "KV cache use per server (%)", scale=100.0, unit="%",
                         key="rollout_kv")
        elif label == "Requests":
            common.chart("rollout_requests", rollout, key="rollout_requests")
        elif label == "Preemptions":
            common.chart("rollout_by_server", rollout, "preemptions_per_s",
                         "Preemptions per second per server", unit="per s",
                         key="rollout_preemptions")
        elif label == "Tail":
            common.chart("rollout_tail", rollout, key="rollout_tail")
        else:
            common.chart("rollout_by_server", rollout, "e2e_latency_mean_s",
                         "Mean end-to-end request latency per server (s)", unit="s",
                         key="rollout_latency")
    st.caption("Colocated engines (the agent loop on a sync trainer) sleep while the trainer "
               "trains; a fully-async rollout pool generates through the step and pauses its "
               "requests while the weights are synced.")


live()
