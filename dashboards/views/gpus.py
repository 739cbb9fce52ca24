"""GPUs: a table of every GPU, then heat maps GPU x time or the per-phase attribution (one
chart at a time, picked in tabs), the GPUs an open flag names highlighted.

The page draws no verdict of its own: a GPU is marked when an open flag (gpu_imbalance,
low_utilization, ...) covers it, so the page and the flags always agree; the thresholds live
in ``monitor/defaults.yaml`` with the detectors. Where a straggler flag names a phase, the
table adds each GPU's utilization and SM activity in that phase since the flag opened (what
the detector looked at: the window's means mix every phase and hide the straggler).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import streamlit as st

from dashboards import charts, common
from dashboards.escape import escape_markdown
from dashboards.sources import SourceError
from dashboards.sources.alerts import base_kind

#: The page's charts, one drawn at a time (the first by default).
VIEWS = ["Utilization", "SM active", "Memory", "Per phase"]
#: Width of the buckets behind the "lowest one-minute" column, seconds.
LOW_BUCKET_S = 60.0

settings = common.settings()
st.title("GPUs")

try:
    nodes = common.load_nodes(common.key()) if common.load_status(common.key()).ok else []
except SourceError:
    nodes = []
node_choice = None
if len(nodes) > 1:
    node_choice = st.selectbox("Node", nodes, key="node", bind="query-params",
                               help="Heat maps show one node's GPUs; the Nodes page compares nodes.")


def gpu_table(gpu: pd.DataFrame, flags: list, single_node: bool) -> pd.DataFrame:
    """Per GPU over the window: mean utilization and SM activity, the lowest one-minute mean
    utilization, peak memory, the gap to its node's median, and the open flags covering it."""
    mem = "mem_used_bytes_max" if "mem_used_bytes_max" in gpu.columns else "mem_used_bytes"
    per = gpu.groupby(["node", "gpu"]).agg(util=("util", "mean"), sm_active=("sm_active", "mean"),
                                           mem_gib=(mem, "max")).reset_index()
    # the lowest one-minute mean: a GPU that lagged for minutes stands out, while the idle
    # seconds between phases that every GPU has (a per-sample minimum reads ~0 everywhere) do not
    minute = gpu.assign(_m=(gpu["ts"] // LOW_BUCKET_S).astype("int64"))
    per_min = minute.groupby(["node", "gpu", "_m"])["util"].mean()
    per["util_low_1m"] = per_min.groupby(["node", "gpu"]).min().reindex(
        pd.MultiIndex.from_frame(per[["node", "gpu"]])).to_numpy()
    per["mem_gib"] = per["mem_gib"] / charts.GIB
    gap = per["util"] - per.groupby("node")["util"].transform("median")
    per["vs_peers"] = np.round(gap) + 0.0  # whole points; never "-0"
    per["status"] = [
        ", ".join(f"{f.kind} ({f.severity})"
                  for f in common.flags_on_gpu(flags, r.node, r.gpu, single_node)) or "ok"
        for r in per.itertuples()
    ]
    return per


def _imbalance_notes(flags: list) -> None:
    """Above the table: each open gpu_imbalance flag of the node picked, or that the GPUs are
    balanced (and on which other nodes such a flag is open)."""
    imbalance = [f for f in flags if base_kind(f.kind) == "gpu_imbalance"
                 and (node_choice is None or f.scope.get("node") in (None, node_choice))]
    if imbalance:
        for f in imbalance:
            st.warning(f"**{escape_markdown(common.flag_title(f))}**  \n"
                       f"{escape_markdown(f.evidence)}", icon=":material/warning:")
    else:
        where = f" on {node_choice}" if node_choice else ""
        st.success(f"GPUs balanced{where}: no gpu_imbalance flag is open (the detector compares "
                   "each GPU with its peers on the node; thresholds in monitor/defaults.yaml).",
                   icon=":material/check_circle:")
        elsewhere = sorted({str(f.scope.get("node")) for f in flags
                            if base_kind(f.kind) == "gpu_imbalance" and f.scope.get("node")})
        if elsewhere:
            st.info(f"A straggler or imbalance flag is open on {', '.join(elsewhere)}: pick it "
                    "under Node.")


@common.live_panel(settings)
def live(start: float, end: float, key: str) -> None:
    """Heat maps and attribution; reruns on the live refresh."""
    gpu = common.load_gpu(key, start, end, common.MAX_POINTS, node_choice)
    steps = common.load_steps(key, start, end)
    flags = common.open_flags(common.load_flags(key, True, start, end))
    if gpu.empty:
        st.info("No GPU samples in this window yet.")
        return
    table = gpu_table(gpu, flags, single_node=len(nodes) <= 1)
    looked = where_the_flag_looked(key, flags, end, steps)
    phase_cols = {}
    if looked is not None:
        phase, since, per_phase = looked
        table = table.merge(per_phase, on=["node", "gpu"], how="left")
        cols = list(table.columns)  # beside the window's util and SM
        for col in ("phase_sm", "phase_util"):
            cols.remove(col)
            cols.insert(cols.index("sm_active") + 1, col)
        table = table[cols]
        phase_cols = {
            "phase_util": st.column_config.NumberColumn(
                f"util % in {phase}", format="%.0f",
                help=f"mean utilization in {phase} since the flag opened ({since})"),
            "phase_sm": st.column_config.NumberColumn(
                f"SM % in {phase}", format="%.0f",
                help=f"mean SM activity in {phase} since the flag opened ({since}): where "
                "the straggler flag looked"),
        }
    flagged = table[table["status"] != "ok"]
    _imbalance_notes(flags)
    st.dataframe(
        table, hide_index=True, key="gpu_table", width="stretch",
        column_config={
            "node": st.column_config.TextColumn("node", width="small"),
            "gpu": st.column_config.NumberColumn("GPU", width="small", format="%d"),
            "util": st.column_config.ProgressColumn("util %", min_value=0, max_value=100,
                                                    format="%.0f", width="small"),
            "sm_active": st.column_config.NumberColumn(
                "SM %", format="%.0f", width="small",
                help="SM active % (GPM), mean over the window (every phase mixed in)"),
            **phase_cols,
            "util_low_1m": st.column_config.NumberColumn(
                "low 1-min %", format="%.0f", width="small",
                help="lowest mean utilization over any one minute of the window"),
            "mem_gib": st.column_config.NumberColumn("peak mem GiB", format="%.1f",
                                                     width="small"),
            "vs_peers": st.column_config.NumberColumn(
                "vs median", format="%+.0f", width="small",
                help="points: window mean utilization minus the median of the node's GPUs"),
            "status": st.column_config.TextColumn("open flags", width="medium"),
        },
    )
    # one chart at a time: the view picked (bound to the URL as ``gpu_view``)
    label, tab = common.chosen_tab(VIEWS, "gpu_view")
    with tab:
        if label == "Per phase":
            attribution(key, start, end, steps)
            return
        marked = gpu_marks(flagged, flags, single_node=len(nodes) <= 1)
        if label == "Memory":
            mem_col = "mem_used_bytes_max" if "mem_used_bytes_max" in gpu.columns else "mem_used_bytes"
            total = gpu["mem_total_bytes"].max()
            fig = charts.gpu_heatmap(gpu, mem_col, "Memory used (GiB)", scale=1 / charts.GIB,
                                     zmax=(total / charts.GIB) if pd.notna(total) else None,
                                     colorscale="Cividis")
        elif label == "SM active":
            fig = charts.gpu_heatmap(gpu, "sm_active", "SM active % (GPM)", highlight=marked)
        else:
            fig = charts.gpu_heatmap(gpu, "util", "Utilization % (NVML: a kernel was running)",
                                     highlight=marked)
        st.plotly_chart(charts.end_at(fig, start, end), key="gpu_heat")


def where_the_flag_looked(key: str, flags: list, end: float, steps: list
                          ) -> tuple[str, str, pd.DataFrame] | None:
    """(phase, since when in words, per GPU ``node, gpu, phase_util, phase_sm``) for the first
    open straggler flag that names a phase, over the last steps since it opened; None when no
    such flag is open or no step since then has samples in that phase."""
    named = [f for f in common.rank_flags(flags) if base_kind(f.kind) == "gpu_imbalance"
             and f.scope.get("phase") and (node_choice is None
                                           or f.scope.get("node") in (None, node_choice))]
    timed = [s for s in steps if s.end_time is not None]
    if not named or not timed:
        return None
    flag = named[0]
    last_end = float(timed[-1].end_time)
    summary = common.load_attribution(key, float(flag.start), min(end, last_end), last_end,
                                      flag.scope.get("node") or node_choice, _steps_end=end)
    phase = str(flag.scope["phase"])
    if summary is None or summary.empty:
        return None
    part = summary[summary["phase"] == phase]
    if part.empty or part["sm_mean"].isna().all():
        return None
    per = part[["node", "gpu", "util_mean", "sm_mean"]].rename(
        columns={"util_mean": "phase_util", "sm_mean": "phase_sm"})
    per = per.assign(gpu=pd.to_numeric(per["gpu"], errors="coerce").astype("Int64"))
    return phase, common.fmt_time(flag.start), per


def gpu_marks(flagged: pd.DataFrame, flags: list, single_node: bool) -> dict[str, str]:
    """"node/gpu" -> the word the heat map writes beside it: STRAGGLER for the GPU the others
    wait for, before any other open flag's word (``common.gpu_mark``)."""
    marks = {}
    for r in flagged.itertuples():
        words = [common.gpu_mark(f) for f in common.rank_flags(
            common.flags_on_gpu(flags, r.node, r.gpu, single_node))]
        if words:
            marks[f"{r.node}/{r.gpu}"] = words[0]
    return marks


def attribution(key: str, start: float, end: float, steps: list) -> None:
    """Per phase and GPU: the GPUs' utilization in each phase of the last steps."""
    if not steps or steps[-1].end_time is None:
        st.info("No steps in this window to attribute GPU time to.")
        return
    last_end = float(steps[-1].end_time)
    summary = common.load_attribution(key, start, min(end, last_end), last_end, node_choice,
                                      _steps_end=end)
    st.plotly_chart(charts.phase_attribution_bars(summary), key="gpu_attrib")
    st.caption(common.attribution_caption(summary, min(len(steps), common.ATTRIB_STEPS)))


live()
