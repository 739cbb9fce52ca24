"""One interface for where the dashboards read metrics: the local run store or Prometheus.

A :class:`MetricSource` answers in canonical shapes only: GPU and host frames with the
interchange columns (``monitor/frames.py``), already downsampled to about ``max_points`` per
series; :class:`~monitor.records.StepRecord` lists; :class:`~monitor.records.Flag` lists; an
NCCL frame (:data:`NCCL_COLUMNS`); per-node aggregates (:data:`NODE_SUMMARY_COLUMNS`). The
dashboards never know which source they read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd

from monitor.api import ALL_PHASES, StepRecord

#: NCCL activity per time bucket: ``exec_share`` is NCCL seconds per wall second (summed over
#: communicators and ranks of the node), ``bytes_per_s`` message bytes per second, ``busbw_bps``
#: the mean bus bandwidth of the bucket; ``rank`` is empty where the source does not know it.
NCCL_COLUMNS: tuple[str, ...] = (
    "ts",
    "node",
    "rank",
    "coll",
    "exec_share",
    "bytes_per_s",
    "busbw_bps",
)

#: One row per node: GPU activity aggregated over the window, and the open flags naming it
#: (``outlier``/``reason``, set by :func:`mark_outliers`).
NODE_SUMMARY_COLUMNS: tuple[str, ...] = (
    "node",
    "gpus",
    "util_mean",
    "util_min_gpu",
    "util_max_gpu",
    "util_spread",
    "sm_active_mean",
    "mem_used_max_ratio",
    "iowait_mean",
    "outlier",
    "reason",
)


#: Who holds a hung job: one row per named rank or process (``monitor/hang``), newest round.
CULPRIT_COLUMNS: tuple[str, ...] = ("ts", "node", "rank", "pid", "gpu", "collective", "seq",
                                    "frame", "reason")


def culprits_from_events(events: list) -> pd.DataFrame:
    """:data:`CULPRIT_COLUMNS` from ``hang_dump`` events: each node's newest round."""
    newest: dict[str, object] = {}
    for e in events:
        if getattr(e, "kind", None) == "hang_dump" and e.time is not None:
            node = str(e.data.get("node", ""))
            if node not in newest or e.time >= newest[node].time:
                newest[node] = e
    rows = []
    for e in newest.values():
        for c in e.data.get("culprits") or []:
            rank = c.get("rank")
            rows.append({"ts": e.time, "node": c.get("node") or e.data.get("node", ""),
                         "rank": "" if rank is None or rank < 0 else str(rank),
                         "pid": "" if c.get("pid") is None else str(c["pid"]),
                         "gpu": "" if c.get("gpu") is None else str(c["gpu"]),
                         "collective": c.get("collective", ""),
                         "seq": "" if c.get("seq") is None else str(c["seq"]),
                         "frame": c.get("frame", ""), "reason": c.get("reason", "")})
    return pd.DataFrame(rows, columns=list(CULPRIT_COLUMNS))


#: Activity across GPUs per time bucket (mean and lowest utilization, mean SM activity).
FLEET_COLUMNS: tuple[str, ...] = ("ts", "util_mean", "util_min", "sm_active_mean")


def fleet_from_gpu(gpu: pd.DataFrame) -> pd.DataFrame:
    """:data:`FLEET_COLUMNS` from a GPU frame (lowest uses ``util_min`` when present)."""
    if gpu is None or gpu.empty:
        return pd.DataFrame(columns=list(FLEET_COLUMNS))
    low = "util_min" if "util_min" in gpu.columns else "util"
    g = gpu.groupby("ts")
    out = pd.DataFrame({"util_mean": g["util"].mean(), "util_min": g[low].min(),
                        "sm_active_mean": g["sm_active"].mean()}).reset_index()
    return out[list(FLEET_COLUMNS)]


#: Rollout engines per time bucket and server (the Rollout page): gauges averaged over the
#: bucket (KV cache use 0..1, requests running / waiting / paused; ``sleeping`` the share of the
#: bucket asleep), counters as rates (preemptions and generated tokens per second), and the mean
#: queue time and end-to-end latency of the requests done in the bucket.
ROLLOUT_VIEW_COLUMNS: tuple[str, ...] = (
    "ts", "node", "server", "engine", "model", "kv_cache_usage", "running", "waiting", "paused",
    "preemptions_per_s", "tokens_per_s", "queue_time_mean_s", "e2e_latency_mean_s", "sleeping",
)


def rollout_view(raw: pd.DataFrame, width: float) -> pd.DataFrame:
    """:data:`ROLLOUT_VIEW_COLUMNS` from rollout samples (``monitor.frames.ROLLOUT_COLUMNS``)
    in buckets of ``width`` seconds per (node, server). A counter's rate is its rise from the
    previous bucket's last value (a restart, where it falls, counts from zero)."""
    if raw is None or raw.empty:
        return pd.DataFrame(columns=list(ROLLOUT_VIEW_COLUMNS))
    df = raw.copy()
    df["ts"] = np.floor(df["ts"].astype(float) / width) * width
    keys = ["node", "server"]
    g = df.groupby([*keys, "ts"], observed=True, sort=True)
    # ``engine`` is a keyword of ``agg`` itself (numba): aggregate under other names
    out = g.agg(eng=("engine", "last"), mdl=("model", "last"),
                kv_cache_usage=("kv_cache_usage", "mean"), running=("running", "mean"),
                waiting=("waiting", "mean"), paused=("paused", "mean"),
                queue_time_mean_s=("queue_time_mean_s", "mean"),
                e2e_latency_mean_s=("e2e_latency_mean_s", "mean"),
                sleeping=("sleeping", "mean"),
                pre=("preemptions_total", "last"), tok=("generation_tokens_total", "last"),
                ).reset_index().rename(columns={"eng": "engine", "mdl": "model"})
    for col, rate in (("pre", "preemptions_per_s"), ("tok", "tokens_per_s")):
        rise = out.groupby(keys, observed=True)[col].diff()
        rise = rise.where(rise.isna() | (rise >= 0), out[col])  # a restart counts from zero
        out[rate] = rise / width
    return out[list(ROLLOUT_VIEW_COLUMNS)].reset_index(drop=True)


class SourceError(RuntimeError):
    """The source cannot answer; the message is one line a person reads."""


@dataclass(frozen=True)
class SourceStatus:
    """Whether the source can be read, with the words the UI shows when it cannot.

    Messages: ``"store missing: PATH"``, ``"Prometheus unreachable at URL: REASON"``,
    ``"no data yet"``, or ``"ok"`` with a short description.
    """

    ok: bool
    message: str


@runtime_checkable
class MetricSource(Protocol):
    """What the dashboards read. ``start``/``end`` are unix seconds."""

    #: "store" or "prometheus".
    kind: str
    #: Where it reads from, for the sidebar ("store /path/run.sqlite").
    label: str

    def status(self) -> SourceStatus:
        """Readable and holding data? Never raises."""
        ...

    def time_range(self) -> tuple[float, float] | None:
        """First and last sample time, or None when there is no data."""
        ...

    def nodes(self) -> list[str]:
        """Node names, sorted."""
        ...

    def gpu_frame(
        self, start: float, end: float, max_points: int = 1000, node: str | None = None
    ) -> pd.DataFrame:
        """GPU samples (interchange columns plus ``util_min``/``mem_used_bytes_max``...)."""
        ...

    def host_frame(
        self, start: float, end: float, max_points: int = 1000, node: str | None = None
    ) -> pd.DataFrame:
        """Host samples (interchange columns plus envelope columns)."""
        ...

    def steps(self, start: float | None = None, end: float | None = None) -> list[StepRecord]:
        """Training steps that ended inside the window, in step order."""
        ...

    def flags(
        self, active_only: bool = False, start: float | None = None, end: float | None = None
    ) -> list:
        """Detector flags overlapping the window (all when no window), newest first."""
        ...

    def nccl_frame(self, start: float, end: float, max_points: int = 1000) -> pd.DataFrame:
        """NCCL activity per bucket with :data:`NCCL_COLUMNS`."""
        ...

    def node_summary(self, start: float, end: float) -> pd.DataFrame:
        """One row per node with :data:`NODE_SUMMARY_COLUMNS`."""
        ...

    def node_frame(self, start: float, end: float, max_points: int = 1000) -> pd.DataFrame:
        """Mean GPU utilization per node over time: columns ``ts, node, util``."""
        ...

    def fleet_frame(
        self, start: float, end: float, max_points: int = 1000, node: str | None = None
    ) -> pd.DataFrame:
        """GPU activity across all GPUs (or one node's) over time: :data:`FLEET_COLUMNS`.
        Cheap at any scale: the source aggregates before anything crosses to Python."""
        ...

    def rollout_frame(self, start: float, end: float, max_points: int = 1000) -> pd.DataFrame:
        """Rollout engines per bucket and server: :data:`ROLLOUT_VIEW_COLUMNS` (empty when
        the run has no engine servers)."""
        ...

    def hang_culprits(self, start: float, end: float) -> pd.DataFrame:
        """Who holds a hung job (:data:`CULPRIT_COLUMNS`): the newest dump round's culprits
        in the window, from every node (empty when no round named anyone)."""
        ...

    def pending_flags(self, start: float | None = None, end: float | None = None) -> list:
        """What is open but does not page, as ``(Flag, why)`` pairs, newest first: pending
        alerts and flags their alert rule holds back (Prometheus; empty from a store)."""
        ...

    def jobs(self) -> list[str]:
        """The scrape jobs the source holds exporters of (Prometheus; empty from a store)."""
        ...

    def phase_activity(self, start: float, end: float) -> pd.DataFrame:
        """Per phase, from the exporters' per-phase counters: ``phase_summary`` columns for
        the mean GPU (Prometheus; empty from a store, whose samples are attributed as they are)."""
        ...


def steps_to_frame(steps: list[StepRecord]) -> pd.DataFrame:
    """A flat frame of steps: ``step, end_time, total, throughput, mem_reserved_peak_bytes``
    and one column per canonical phase present in any step (seconds, NaN where absent)."""
    base = ["step", "end_time", "total", "throughput", "mem_reserved_peak_bytes"]
    if not steps:
        return pd.DataFrame(columns=base, dtype=float)
    rows = []
    for rec in steps:
        row = {
            "step": rec.step,
            "end_time": rec.end_time,
            "total": rec.total,
            "throughput": rec.throughput,
            "mem_reserved_peak_bytes": rec.mem_reserved_peak_bytes,
        }
        row.update({f"phase:{k}": v for k, v in rec.phases.items()})
        rows.append(row)
    df = pd.DataFrame(rows)
    phase_cols = [f"phase:{p}" for p in ALL_PHASES if f"phase:{p}" in df.columns]
    extra = [c for c in df.columns if c.startswith("phase:") and c not in phase_cols]
    df = df[base + phase_cols + extra]
    df = df.rename(columns={c: c.split(":", 1)[1] for c in phase_cols + extra})
    return df.sort_values("step", kind="stable").reset_index(drop=True)


def node_summary_from_gpu(gpu: pd.DataFrame, host: pd.DataFrame | None = None) -> pd.DataFrame:
    """Aggregate a GPU frame (any resolution) into one row per node, outliers marked."""
    if gpu is None or gpu.empty:
        return pd.DataFrame(columns=list(NODE_SUMMARY_COLUMNS))
    per_gpu = gpu.groupby(["node", "gpu"], observed=True).agg(
        util=("util", "mean"),
        sm_active=("sm_active", "mean"),
        mem_used=("mem_used_bytes", "max"),
        mem_total=("mem_total_bytes", "max"),
    )
    per_gpu["mem_ratio"] = per_gpu["mem_used"] / per_gpu["mem_total"].where(
        per_gpu["mem_total"] > 0
    )
    return summarize_nodes(per_gpu.reset_index(), host)


def summarize_nodes(per_gpu: pd.DataFrame, host: pd.DataFrame | None = None) -> pd.DataFrame:
    """From per-GPU window means (``node, gpu, util, sm_active, mem_ratio``) to node rows."""
    g = per_gpu.groupby("node", observed=True)
    out = pd.DataFrame(
        {
            "gpus": g["gpu"].nunique(),
            "util_mean": g["util"].mean(),
            "util_min_gpu": g["util"].min(),
            "util_max_gpu": g["util"].max(),
            "sm_active_mean": g["sm_active"].mean(),
            "mem_used_max_ratio": g["mem_ratio"].max(),
        }
    )
    out["util_spread"] = out["util_max_gpu"] - out["util_min_gpu"]
    if host is not None and not host.empty and "iowait_pct" in host.columns:
        out["iowait_mean"] = host.groupby("node", observed=True)["iowait_pct"].mean()
    else:
        out["iowait_mean"] = np.nan
    out = out.reset_index()
    out = mark_outliers(out)  # no flags here: the page marks nodes from the open flags
    return out[list(NODE_SUMMARY_COLUMNS)].sort_values("node").reset_index(drop=True)


def mark_outliers(summary: pd.DataFrame, flags: list | None = None) -> pd.DataFrame:
    """Set ``outlier`` (bool) and ``reason`` (words) of a node summary from the open flags.

    The pages draw no verdict of their own: a node is marked while an open flag names it (the
    detectors judge with the thresholds in ``monitor/defaults.yaml``), so the Nodes page
    cannot contradict the flags. Without flags every node is unmarked.
    """
    df = summary.copy()
    reasons: dict[str, list[str]] = {}
    for flag in flags or []:
        if getattr(flag, "end", None) is not None:
            continue
        node = (getattr(flag, "scope", None) or {}).get("node")
        if node is None:
            continue
        gpus = flag.scope.get("gpus")
        where = f" (GPU {','.join(str(g) for g in gpus)})" if gpus else ""
        words = f"{flag.kind} {flag.severity}{where}"
        if words not in reasons.setdefault(str(node), []):
            reasons[str(node)].append(words)
    df["reason"] = ["; ".join(reasons.get(str(n), [])) for n in df["node"]]
    df["outlier"] = df["reason"] != ""
    return df


def parse_scope(label: str) -> dict:
    """Invert :pyattr:`Flag.scope_label` ("node=n0 gpus=3,5 phase=gen") into a scope dict."""
    scope: dict = {}
    for part in (label or "").split():
        key, _, val = part.partition("=")
        if not val:
            continue
        if key == "gpus":
            scope[key] = [int(v) if v.isdigit() else v for v in val.split(",") if v]
        elif key == "steps":
            scope[key] = [int(v) for v in val.split(",") if v.lstrip("-").isdigit()]
        else:
            scope[key] = val
    return scope
