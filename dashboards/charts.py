"""Plotly figure builders for the dashboard pages: frames in, figures out, no Streamlit.

Every builder takes canonical frames (already downsampled by the source) and returns a
``go.Figure`` with ``uirevision`` set, so a live refresh keeps the user's zoom. Times are unix
seconds in the frames and UTC datetimes on the axes.
"""

from __future__ import annotations

import html

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from monitor.api import ALL_PHASES, Flag

#: One colour per canonical phase, stable across every chart.
PHASE_COLORS: dict[str, str] = {
    "gen": "#4C78A8",
    "reward": "#F58518",
    "old_log_prob": "#54A24B",
    "ref": "#B279A2",
    "values": "#9D755D",
    "adv": "#BAB0AC",
    "update_critic": "#EECA3B",
    "update_actor": "#E45756",
    "reshard": "#FF9DA6",
    "testing": "#72B7B2",
    "save_checkpoint": "#79706E",
    "rollout_wait": "#D67195",
    "comm": "#8CD17D",
    "other": "#D3D3D3",
}
SEVERITY_COLORS = {"critical": "#D62728", "warning": "#FF9F0E", "info": "#1F77B4"}
GIB = 2**30


def to_time(ts) -> pd.Series | pd.DatetimeIndex:
    """Unix seconds to UTC datetimes for plotly axes."""
    return pd.to_datetime(pd.Series(ts, dtype="float64"), unit="s")


def _layout(fig: go.Figure, title: str, height: int = 320, key: str = "") -> go.Figure:
    fig.update_layout(
        title=title,
        height=height,
        margin={"l": 50, "r": 20, "t": 40, "b": 40},
        uirevision=key or title,
        legend={"orientation": "h", "yanchor": "top", "y": -0.18, "x": 0, "xanchor": "left"},
    )
    return fig


def step_axis(fig: go.Figure, steps) -> go.Figure:
    """An x axis of step numbers: whole numbers only (one tick per step when there are few)."""
    vals = pd.Series(steps, dtype="float64").dropna()
    span = float(vals.max() - vals.min()) if len(vals) else 0.0
    fig.update_xaxes(title="step", tickformat="d", dtick=1 if span <= 12 else None,
                     tick0=float(vals.min()) if len(vals) else 0)
    return fig


def end_at(fig: go.Figure, start: float, end: float) -> go.Figure:
    """Pin a time axis to the window ``[start, end]``: a chart ends at the newest sample
    ("now"), never at a padded or extrapolated time."""
    if fig.data:
        fig.update_xaxes(range=[to_time([start]).iloc[0], to_time([end]).iloc[0]])
    return fig


#: Points above which a line is drawn without a marker per point: each marker is an SVG
#: element to style and place, about 1 ms each in Chromium on a 2-core machine, where the line
#: is one path.
MARKERS_MAX = 150


def line_mode(n_points: int) -> str:
    """``"lines+markers"`` for a short series, ``"lines"`` for a long one (``MARKERS_MAX``)."""
    return "lines+markers" if n_points <= MARKERS_MAX else "lines"


def empty_figure(title: str, message: str = "no data in this window") -> go.Figure:
    """A blank chart that says why it is blank."""
    fig = go.Figure()
    fig.add_annotation(text=message, showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    return _layout(fig, title, height=200)


def phase_columns(steps: pd.DataFrame) -> list[str]:
    """Phase columns of a steps frame, in canonical order."""
    return [p for p in ALL_PHASES if p in steps.columns and steps[p].notna().any()]


def flagged_steps(flags: list, kind: str, steps: pd.DataFrame) -> set[int]:
    """Steps covered by the flags of ``kind``: the scope's step range when the flag carries
    one, else the steps that ended while it was open. Charts mark these, so a chart's "spike"
    is exactly what the detector (thresholds in ``monitor/defaults.yaml``) flagged."""
    out: set[int] = set()
    for f in flags or []:
        if f.kind != kind:
            continue
        rng = f.scope.get("steps")
        if rng and len(rng) >= 2:
            out.update(range(int(rng[0]), int(rng[-1]) + 1))
        elif not steps.empty and "end_time" in steps.columns:
            end = f.end if f.end is not None else float("inf")
            hit = steps[(steps["end_time"] >= f.start) & (steps["end_time"] <= end)]
            out.update(int(s) for s in hit["step"])
    return out


def step_time_trend(steps: pd.DataFrame, window: int = 10,
                    flagged: set[int] | None = None) -> go.Figure:
    """Step time per step with its rolling median; the steps a ``step_time_spikes`` flag
    covers (``flagged``) are marked."""
    title = "Step time"
    if steps.empty or steps["total"].isna().all():
        return empty_figure(title, "no steps yet")
    fig = _against_median(steps, "total", window, flagged, name="step time", color="#4C78A8",
                          median_mode="lines", spike=("step_time_spikes", 9))
    return _layout(fig, title, key="step_time")


def _against_median(steps: pd.DataFrame, col: str, window: int, flagged: set[int] | None, *,
                    name: str, color: str, median_mode: str | None,
                    spike: tuple[str, int]) -> go.Figure:
    """``col`` per step, its rolling median over ``window`` steps (dotted; ``median_mode``
    the trace's mode, None for plotly's default) and the ``flagged`` steps marked as spikes
    of the flag kind ``spike[0]`` (marker size ``spike[1]``), on a step axis in seconds."""
    df = steps.dropna(subset=[col])
    med = df[col].rolling(window, min_periods=1).median()
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=df["step"], y=df[col], mode=line_mode(len(df)), name=name,
                             marker={"size": 4}, line={"color": color}))
    fig.add_trace(go.Scatter(x=df["step"], y=med, name=f"rolling median ({window})",
                             line={"dash": "dot", "color": "#555"},
                             **({"mode": median_mode} if median_mode else {})))
    spikes = df[df["step"].isin(flagged or set())]
    if not spikes.empty:
        fig.add_trace(go.Scatter(x=spikes["step"], y=spikes[col], mode="markers",
                                 name=f"spike ({spike[0]} flag)",
                                 marker={"color": SEVERITY_COLORS["critical"], "size": spike[1]}))
    step_axis(fig, df["step"])
    fig.update_yaxes(title="seconds", rangemode="tozero")
    return fig


def throughput_trend(steps: pd.DataFrame) -> go.Figure:
    """Throughput (tokens/s per GPU, as verl reports it) per step."""
    title = "Throughput (tokens/s per GPU)"
    if steps.empty or steps["throughput"].isna().all():
        return empty_figure(title, "the log gives no perf/throughput yet")
    df = steps.dropna(subset=["throughput"])
    fig = go.Figure(go.Scatter(x=df["step"], y=df["throughput"], mode="lines", name="throughput",
                               line={"color": "#54A24B"}))
    step_axis(fig, df["step"])
    fig.update_yaxes(title="tokens/s/GPU", rangemode="tozero")
    return _layout(fig, title, key="throughput")


def phase_stacked_bars(steps: pd.DataFrame, last: int = 60) -> go.Figure:
    """Where the time goes: seconds per phase, stacked, one bar per step (last ``last`` steps)."""
    title = "Where the time goes (seconds per phase, per step)"
    phases = phase_columns(steps)
    if steps.empty or not phases:
        return empty_figure(title, "no phase timings yet")
    df = steps.tail(last)
    fig = go.Figure()
    for phase in phases:
        fig.add_trace(go.Bar(x=df["step"], y=df[phase], name=phase,
                             marker_color=PHASE_COLORS.get(phase, "#888")))
    fig.update_layout(barmode="stack")
    step_axis(fig, df["step"])
    fig.update_yaxes(title="seconds")
    return _layout(fig, title, height=360, key="phase_bars")


#: Colours of the goodput causes: productive green, losses warm, unattributed grey.
CAUSE_COLORS: dict[str, str] = {
    "productive": "#2ca02c", "warmup": "#c7e9c0", "data_loading": "#d62728", "rollout_long_tail": "#ff7f0e",
    "straggler_wait": "#9467bd", "weight_sync": "#8c564b", "communication": "#e377c2",
    "cpu_phases": "#bcbd22", "validation_checkpoint": "#17becf", "low_activity": "#ffbb78",
    "restarts": "#7f0000", "unattributed": "#bbbbbb",
}


def goodput_bars(ledger: pd.DataFrame) -> go.Figure:
    """Where every GPU-second went, per step: each cause's share of the step's GPU-seconds,
    stacked to 100% (a goodput ledger, ``monitor.analysis.goodput.ledger``)."""
    title = "Goodput: each step's GPU-seconds by cause (%)"
    if ledger is None or len(ledger) == 0:
        return empty_figure(title, "no steps with GPU samples yet")
    from monitor.api import CAUSES

    rows = ledger[~ledger["tail"].astype(bool)] if "tail" in ledger.columns else ledger
    per = rows.groupby("step")[["wall", *CAUSES]].sum()
    per = per[per["wall"] > 0]
    fig = go.Figure()
    for cause in CAUSES:
        share = 100.0 * per[cause] / per["wall"]
        if not (share > 0.05).any():
            continue
        fig.add_trace(go.Bar(x=[int(x) for x in per.index], y=share.round(2).tolist(), name=cause,
                             marker_color=CAUSE_COLORS.get(cause, "#888")))
    fig.update_layout(barmode="stack")
    step_axis(fig, per.index)
    fig.update_yaxes(title="% of GPU-seconds", range=[0, 100])
    return _layout(fig, title, height=320, key="goodput_bars")


def gpu_heatmap(gpu: pd.DataFrame, column: str, title: str, scale: float = 1.0,
                zmax: float | None = 100.0, colorscale: str = "Viridis",
                highlight: dict[str, str] | None = None) -> go.Figure:
    """GPU x time heat map of one column (rows ``node/gpu``); a row in ``highlight`` has its
    word ("STRAGGLER", "LOW UTIL", ...) written in red in its own label, so the mark never
    overlaps the row name."""
    if gpu.empty or column not in gpu.columns or gpu[column].isna().all():
        return empty_figure(title)
    df = gpu.assign(row=gpu["node"].astype(str) + "/" + gpu["gpu"].astype(str))
    grid = df.groupby(["row", "ts"], sort=False)[column].mean().unstack("ts")
    grid = grid.reindex(sorted(grid.index, key=_natural_key))
    fig = go.Figure(
        go.Heatmap(
            z=grid.to_numpy() * scale,
            x=to_time(grid.columns.to_numpy()).to_numpy(),
            y=np.asarray(grid.index, dtype=object),
            zmin=0,
            zmax=zmax,
            colorscale=colorscale,
            colorbar={"thickness": 10},
            hovertemplate="%{y}<br>%{x}<br>%{z:.1f}<extra></extra>",
        )
    )
    fig.update_yaxes(title="node/gpu", autorange="reversed", type="category")
    _row_labels(fig, grid.index, highlight or {})
    height = 120 + 18 * min(len(grid.index), 40)
    return _layout(fig, title, height=max(height, 240), key=f"heat_{column}")


#: Row labels a heat map writes at most; past it every k-th is written (hover names each row):
#: Chromium measures every label it places, about 1 ms each on a 2-core machine.
ROW_LABELS_MAX = 32


def _row_labels(fig: go.Figure, rows, marks: dict[str, str] | None = None) -> None:
    """Label every row of a categorical y axis, or every k-th when there are too many (a
    marked row always); a marked row's label carries its mark in red after its name."""
    rows = list(rows)
    marks = {r: w for r, w in (marks or {}).items() if r in set(rows)}
    if len(rows) <= ROW_LABELS_MAX and not marks:
        return
    every = -(-len(rows) // ROW_LABELS_MAX) if len(rows) > ROW_LABELS_MAX else 1
    shown = [r for i, r in enumerate(rows) if i % every == 0 or r in marks]
    text = [f'{r} <span style="color:#D62728"><b>{html.escape(marks[r])}</b></span>'
            if r in marks else r for r in shown]
    fig.update_yaxes(tickmode="array", tickvals=shown, ticktext=text)


def node_heatmap(frame: pd.DataFrame, title: str = "Mean GPU utilization by node (%)") -> go.Figure:
    """Node x time heat map of the per-node mean utilization (``ts, node, util``)."""
    if frame.empty:
        return empty_figure(title)
    grid = frame.groupby(["node", "ts"], sort=False)["util"].mean().unstack("ts")
    grid = grid.reindex(sorted(grid.index, key=_natural_key))
    fig = go.Figure(go.Heatmap(z=grid.to_numpy(), x=to_time(grid.columns.to_numpy()).to_numpy(),
                               y=np.asarray(grid.index, dtype=object), zmin=0, zmax=100, colorscale="Viridis",
                               colorbar={"thickness": 10},
                               hovertemplate="%{y}<br>%{x}<br>%{z:.1f}%<extra></extra>"))
    fig.update_yaxes(autorange="reversed", type="category")
    _row_labels(fig, grid.index)
    height = 120 + 8 * min(len(grid.index), 128)
    return _layout(fig, title, height=max(height, 260), key="node_heat")


def phase_attribution_bars(summary: pd.DataFrame, phases: list[str] | None = None) -> go.Figure:
    """Mean utilization of each GPU during each phase (``phase_summary`` output), each bar
    labelled with the samples behind it; withheld phases (too few samples) have no bar."""
    title = "What each GPU did per phase (mean utilization %, n = samples)"
    if summary is None or summary.empty:
        return empty_figure(title, "no step overlaps the GPU samples yet")
    df = summary.copy()
    if phases:
        df = df[df["phase"].isin(phases)]
    df["row"] = df["node"].astype(str) + "/" + df["gpu"].astype(str)
    n_col = "full_samples" if "full_samples" in df.columns else "samples"
    fig = go.Figure()
    for phase in [p for p in ALL_PHASES if p in set(df["phase"])]:
        part = df[(df["phase"] == phase) & df["util_mean"].notna()]
        if part.empty:
            continue
        fig.add_trace(go.Bar(x=part["row"], y=part["util_mean"], name=phase,
                             marker_color=PHASE_COLORS.get(phase, "#888"),
                             customdata=[int(n) for n in part[n_col]],
                             hovertemplate=f"{phase}<br>%{{x}}<br>%{{y:.0f}}% "
                             "(n=%{customdata} samples)<extra></extra>"))
    if not fig.data:
        return empty_figure(title, "every phase is shorter than the sampling interval")
    fig.update_layout(barmode="group")
    fig.update_xaxes(title="node/gpu", type="category")
    fig.update_yaxes(title="util %", range=[0, 100])
    return _layout(fig, title, key="attrib")


def step_timeline(timeline: pd.DataFrame, fleet: pd.DataFrame) -> go.Figure:
    """Phases of the last steps laid out in time (one bar per phase), GPU activity overlaid.

    ``timeline`` is ``phase_timeline`` output (step, phase, start, end), drawn as coloured
    bands; ``fleet`` (``ts, util_mean, util_min``) over the same window: the mean and the
    lowest GPU utilization are drawn over the bands.
    """
    title = "Steps laid out in time, with GPU activity"
    if timeline.empty:
        return empty_figure(title, "no steps in this window")
    fig = go.Figure()
    for phase in [p for p in ALL_PHASES if p in set(timeline["phase"])]:
        part = timeline[timeline["phase"] == phase]
        fig.add_trace(
            go.Bar(
                base=to_time(part["start"]),
                x=(part["end"] - part["start"]).to_numpy() * 1000.0,
                y=[50.0] * len(part),
                width=100.0,
                orientation="h",
                name=phase,
                marker={"color": PHASE_COLORS.get(phase, "#888"), "line": {"width": 0}},
                opacity=0.55,
                customdata=np.stack([part["step"], part["end"] - part["start"]], axis=1),
                hovertemplate=f"{phase}<br>step %{{customdata[0]}}<br>"
                "%{customdata[1]:.1f} s<extra></extra>",
            )
        )
    if fleet is not None and not fleet.empty:
        fig.add_trace(go.Scatter(x=to_time(fleet["ts"]), y=fleet["util_mean"],
                                 name="GPU util mean", line={"color": "#111", "width": 2}))
        fig.add_trace(go.Scatter(x=to_time(fleet["ts"]), y=fleet["util_min"],
                                 name="GPU util lowest",
                                 line={"color": "#B00020", "width": 1.5, "dash": "dot"}))
    fig.update_layout(barmode="overlay", bargap=0)
    fig.update_xaxes(type="date")
    fig.update_yaxes(title="GPU util %", range=[0, 100])
    return _layout(fig, title, height=360, key="timeline")


def reshard_vs_median(steps: pd.DataFrame, window: int = 20,
                      flagged: set[int] | None = None) -> go.Figure:
    """Reshard (weight sync) seconds per step against their rolling median; the steps a
    ``reshard_spike`` flag covers (``flagged``) are marked."""
    title = "Reshard duration vs rolling median"
    if steps.empty or "reshard" not in steps.columns or steps["reshard"].isna().all():
        return empty_figure(title, "the log gives no reshard timing (verl < 0.4.1 hides it in gen)")
    fig = _against_median(steps, "reshard", window, flagged, name="reshard",
                          color=PHASE_COLORS["reshard"], median_mode=None,
                          spike=("reshard_spike", 10))
    return _layout(fig, title, key="reshard")


def comm_share(steps: pd.DataFrame, nccl: pd.DataFrame) -> go.Figure:
    """Communication share of the step (from the log's comm phase) and NCCL busy time."""
    title = "Communication share over time"
    fig = go.Figure()
    if not steps.empty and "comm" in steps.columns and steps["comm"].notna().any():
        df = steps.dropna(subset=["comm", "total", "end_time"])
        fig.add_trace(go.Scatter(x=to_time(df["end_time"]), y=100 * df["comm"] / df["total"],
                                 mode=line_mode(len(df)), name="comm / step (log)"))
    if nccl is not None and not nccl.empty:
        busy = nccl.groupby(["ts", "node"])["exec_share"].sum().groupby("ts").mean()
        fig.add_trace(go.Scatter(x=to_time(busy.index), y=100 * busy.to_numpy(), mode="lines",
                                 name="NCCL busy (% of wall time per GPU, all collectives)"))
    if not fig.data:
        return empty_figure(title, "no comm timing in the log and no NCCL Inspector data")
    limit = 100.0 * comm_share_limit()
    fig.add_hline(y=limit, line_dash="dash", line_color=SEVERITY_COLORS["warning"],
                  annotation_text=f"{limit:.0f}%: comm_heavy (look at the parallel layout)")
    fig.update_yaxes(title="%", rangemode="tozero")
    return _layout(fig, title, key="comm_share")


def comm_share_limit() -> float:
    """``comm_heavy.comm_share_max`` from the config: where the comm_heavy detector starts."""
    from monitor.api import load_config

    return float(load_config().section("comm_heavy").get("comm_share_max", 0.25))


def nccl_by_op(nccl: pd.DataFrame, column: str, title: str, scale: float = 1.0,
               unit: str = "") -> go.Figure:
    """One line per collective of an NCCL column (summed over nodes)."""
    if nccl is None or nccl.empty or nccl[column].isna().all():
        return empty_figure(title, "no NCCL Inspector data (set NCCL_PROFILER_PLUGIN and "
                                   "NCCL_INSPECTOR_ENABLE=1)")
    agg = "mean" if column == "busbw_bps" else "sum"
    # per node first (a sum over its communicators), then the mean over nodes
    df = (nccl.groupby(["coll", "ts", "node"])[column].agg(agg)
          .groupby(["coll", "ts"]).mean().reset_index())
    fig = go.Figure()
    for coll, part in df.groupby("coll"):
        fig.add_trace(go.Scatter(x=to_time(part["ts"]), y=part[column] * scale, name=str(coll),
                                 mode="lines"))
    fig.update_yaxes(title=unit, rangemode="tozero")
    return _layout(fig, title, key=f"nccl_{column}")


def node_skew(nccl: pd.DataFrame) -> go.Figure:
    """NCCL busy share per node: in a collective the straggler shows the SHORTEST time."""
    title = "NCCL time per node (the straggler waits least)"
    if nccl is None or nccl.empty or nccl["node"].nunique() < 2:
        return empty_figure(title, "skew needs NCCL data from two or more nodes")
    per = nccl.groupby("node")["exec_share"].mean().sort_values()
    fig = go.Figure(go.Bar(x=list(per.index), y=100 * per.to_numpy(), name="NCCL busy %"))
    fig.update_yaxes(title="% of wall time")
    return _layout(fig, title, key="node_skew")


def flag_evidence(flag: Flag, gpu: pd.DataFrame, host: pd.DataFrame,
                  steps: pd.DataFrame, fleet: pd.DataFrame | None = None,
                  window: tuple[float, float] | None = None) -> go.Figure:
    """The chart that shows why a flag fired, zoomed to its window (frames already cut).

    ``gpu`` holds the flag's node's GPUs (or is empty on a large cluster when the flag names no
    node; ``fleet`` then stands in with the mean and lowest utilization across GPUs). A time
    axis is pinned to ``window`` (start, end) when given, so it ends at the newest sample.
    """
    kind = flag.kind
    title = f"{kind}: evidence"
    gpus = set(flag.scope.get("gpus") or [])
    fig = go.Figure()
    if kind == "io_starvation" and host is not None and not host.empty:
        for col, name in (("iowait_pct", "iowait %"), ("cpu_max_core_pct", "busiest core %")):
            if col in host.columns and host[col].notna().any():
                fig.add_trace(go.Scatter(x=to_time(host["ts"]), y=host[col], name=name))
        if fleet is not None and not fleet.empty:
            fig.add_trace(go.Scatter(x=to_time(fleet["ts"]), y=fleet["util_mean"],
                                     name="GPU util mean %", line={"dash": "dot"}))
    elif kind in ("reshard_spike",) and "reshard" in steps.columns:
        own = flagged_steps([flag], kind, steps)
        return _shade_steps(reshard_vs_median(steps, flagged=own), flag, steps, title)
    elif kind in ("step_time_spikes", "throughput_regression", "phase_imbalance", "rollout_wait",
                  "rollout_long_tail") and not steps.empty:
        if kind == "throughput_regression":
            return _shade_steps(throughput_trend(steps), flag, steps, title)
        if kind in ("phase_imbalance", "rollout_wait"):
            return _shade_steps(phase_stacked_bars(steps), flag, steps, title)
        own = flagged_steps([flag], "step_time_spikes", steps)
        return _shade_steps(step_time_trend(steps, flagged=own), flag, steps, title)
    elif kind == "comm_heavy" and not steps.empty and "comm" in steps.columns:
        return comm_share(steps, pd.DataFrame()).update_layout(title=title)
    elif kind in ("memory_pressure", "oom", "memory_creep") and gpu is not None and not gpu.empty:
        col = "mem_used_bytes_max" if "mem_used_bytes_max" in gpu.columns else "mem_used_bytes"
        for (node, idx), part in gpu.groupby(["node", "gpu"]):
            fig.add_trace(go.Scatter(x=to_time(part["ts"]), y=part[col] / GIB,
                                     name=f"{node}/{idx}", line={"width": 1}))
        total = gpu["mem_total_bytes"].max()
        if pd.notna(total):
            fig.add_hline(y=total / GIB, line_dash="dash", annotation_text="capacity")
        if kind == "memory_creep":
            _forecast_line(fig, flag, gpu, col, total)
        fig.update_yaxes(title="GiB")
    elif gpu is not None and not gpu.empty:
        col = "sm_active" if kind == "util_overstates_sm" else "util"
        for (node, idx), part in gpu.groupby(["node", "gpu"]):
            hit = int(idx) in gpus if pd.notna(idx) else False
            fig.add_trace(go.Scatter(
                x=to_time(part["ts"]), y=part["util"], name=f"{node}/{idx}" + (" *" if hit else ""),
                line={"width": 3 if hit else 1,
                      "color": SEVERITY_COLORS["critical"] if hit else None},
                opacity=1.0 if hit or not gpus else 0.5))
            if col == "sm_active" and part["sm_active"].notna().any():
                fig.add_trace(go.Scatter(x=to_time(part["ts"]), y=part["sm_active"],
                                         name=f"{node}/{idx} SM active", line={"dash": "dot"}))
        fig.update_yaxes(title="util %", range=[0, 105])
    elif fleet is not None and not fleet.empty:
        for col, name in (("util_mean", "GPU util mean %"), ("util_min", "lowest GPU util %")):
            fig.add_trace(go.Scatter(x=to_time(fleet["ts"]), y=fleet[col], name=name))
        fig.update_yaxes(title="util %", range=[0, 105])
    if not fig.data:
        return empty_figure(title, "no samples in the flag's window")
    _shade(fig, flag)
    if window is not None and kind != "memory_creep":  # the forecast runs past the window
        end_at(fig, *window)
    return _layout(fig, title, height=280, key=f"flag_{kind}")


def _forecast_line(fig: go.Figure, flag: Flag, gpu: pd.DataFrame, col: str,
                   total: float) -> None:
    """memory_creep: the growth of the flag's fastest GPU carried on to the capacity (a dotted
    line, robust slope over per-minute medians), with the flag's forecast as its label."""
    from monitor.api import theil_sen

    gpus = set(flag.scope.get("gpus") or [])
    best: tuple[float, float, float] | None = None  # rate (bytes/s), last ts, last level
    for (_, idx), part in gpu.groupby(["node", "gpu"]):
        if gpus and int(idx) not in gpus:
            continue
        per = part.assign(m=(part["ts"] // 60)).groupby("m").agg(ts=("ts", "max"), v=(col, "median"))
        per = per.dropna().tail(30)
        if len(per) < 3:
            continue
        rate = theil_sen(per["v"].to_numpy(float), per["ts"].to_numpy(float))
        if np.isfinite(rate) and rate > 0 and (best is None or rate > best[0]):
            best = (rate, float(per["ts"].iloc[-1]), float(per["v"].iloc[-1]))
    if best is None or not pd.notna(total) or total <= best[2]:
        return
    rate, t_last, level = best
    t_full = t_last + (float(total) - level) / rate
    text = flag.evidence.split(": ")[-1].rstrip(".") if "out of memory" in flag.evidence else (
        "forecast")
    fig.add_trace(go.Scatter(x=to_time(pd.Series([t_last, t_full])),
                             y=[level / GIB, float(total) / GIB], name=text[:60],
                             mode="lines", line={"dash": "dot", "width": 2,
                                                 "color": SEVERITY_COLORS["critical"]}))


def _shade_steps(fig: go.Figure, flag: Flag, steps: pd.DataFrame, title: str) -> go.Figure:
    """Shade the steps a flag covers on a per-step chart (its scope's steps, else the steps
    that ended while it was open)."""
    span = flag.scope.get("steps")
    if span and len(span) >= 2:
        lo, hi = float(span[0]), float(span[-1])
    elif "end_time" in steps.columns and not steps.empty:
        end = flag.end if flag.end is not None else float("inf")
        inside = steps[(steps["end_time"] >= flag.start) & (steps["end_time"] <= end)]
        if inside.empty:
            return fig.update_layout(title=title)
        lo, hi = float(inside["step"].min()), float(inside["step"].max())
    else:
        return fig.update_layout(title=title)
    fig.add_vrect(x0=lo - 0.5, x1=hi + 0.5, line_width=0, opacity=0.12,
                  fillcolor=SEVERITY_COLORS.get(flag.severity, "#888"))
    return fig.update_layout(title=title, uirevision=f"flag_{flag.kind}")


def _shade(fig: go.Figure, flag: Flag) -> None:
    """Shade the flag's open interval on a time axis."""
    end = flag.end if flag.end is not None else None
    x0 = to_time([flag.start]).iloc[0]
    x1 = to_time([end]).iloc[0] if end is not None else None
    if x1 is None:
        fig.add_vline(x=x0, line_color=SEVERITY_COLORS.get(flag.severity, "#888"))
    else:
        fig.add_vrect(x0=x0, x1=x1, fillcolor=SEVERITY_COLORS.get(flag.severity, "#888"),
                      opacity=0.12, line_width=0)


def _natural_key(label: str):
    """Sort "n2/10" after "n2/9"."""
    import re

    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", str(label))]


# ------------------------------------------------------------------ rollout engines
_NO_ENGINES = ("no rollout-engine data: point the exporter at verl's vLLM / SGLang servers "
               "(--rollout-server URL)")


def _server_label(df: pd.DataFrame) -> pd.Series:
    """``server`` alone on one node, ``node/server`` across nodes."""
    if df["node"].nunique() > 1:
        return df["node"].astype(str) + "/" + df["server"].astype(str)
    return df["server"].astype(str)


def rollout_by_server(rollout: pd.DataFrame, column: str, title: str, scale: float = 1.0,
                      unit: str = "") -> go.Figure:
    """One line per engine server of a rollout column (``ROLLOUT_VIEW_COLUMNS``)."""
    if rollout is None or rollout.empty or rollout[column].isna().all():
        return empty_figure(title, _NO_ENGINES)
    df = rollout.assign(label=_server_label(rollout)).sort_values("ts")
    fig = go.Figure()
    for label in sorted(df["label"].unique(), key=_natural_key):
        part = df[df["label"] == label]
        fig.add_trace(go.Scatter(x=to_time(part["ts"]), y=part[column] * scale, name=label,
                                 mode=line_mode(len(part))))
    fig.update_yaxes(title=unit, rangemode="tozero")
    return _layout(fig, title, key=f"rollout_{column}")


def rollout_requests(rollout: pd.DataFrame) -> go.Figure:
    """Requests running, waiting and paused, summed over the pool's servers."""
    title = "Requests in the rollout pool"
    if rollout is None or rollout.empty:
        return empty_figure(title, _NO_ENGINES)
    tot = rollout.groupby("ts")[["running", "waiting", "paused"]].sum(min_count=1).reset_index()
    fig = go.Figure()
    for col, dash in (("running", "solid"), ("waiting", "dash"), ("paused", "dot")):
        if tot[col].notna().any():
            fig.add_trace(go.Scatter(x=to_time(tot["ts"]), y=tot[col], name=col,
                                     mode=line_mode(len(tot)), line={"dash": dash}))
    fig.update_yaxes(title="requests", rangemode="tozero")
    return _layout(fig, title, key="rollout_requests")


def rollout_tail(rollout: pd.DataFrame) -> go.Figure:
    """The generation tail: requests still running (pool total) against the servers that
    still run any; a long stretch of a few requests on one server is the tail."""
    title = "Generation tail: requests running and servers busy"
    if rollout is None or rollout.empty:
        return empty_figure(title, _NO_ENGINES)
    g = rollout.groupby("ts")
    tot = pd.DataFrame({"running": g["running"].sum(min_count=1),
                        "busy": g["running"].apply(lambda s: float((s >= 0.5).sum())),
                        "servers": g["server"].nunique()}).reset_index()
    x = to_time(tot["ts"])
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=tot["running"], name="requests running (pool)",
                             mode=line_mode(len(tot))))
    fig.add_trace(go.Scatter(x=x, y=tot["busy"], name="servers with a request running",
                             mode=line_mode(len(tot)), yaxis="y2", line={"dash": "dash"}))
    fig.update_layout(yaxis={"title": "requests", "rangemode": "tozero"},
                      yaxis2={"title": "servers", "overlaying": "y", "side": "right",
                              "rangemode": "tozero",
                              "range": [0, float(tot["servers"].max()) + 0.5]})
    return _layout(fig, title, key="rollout_tail")
