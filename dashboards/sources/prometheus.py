"""Read verl-monitor metrics back from Prometheus's HTTP API (httpx).

Range queries use ``step = max(ceil(range / max_points), scrape_interval)`` so a series never
passes Prometheus's 11,000-point limit, and downsample with ``avg_over_time`` plus
``min_over_time`` (activity dips) and ``max_over_time`` (memory spikes), matching
:mod:`monitor.downsample`. Steps are rebuilt from the step gauges: a new step is a change of
``verlmon_training_step`` (or of the last-step timestamp). Flags are the runs of
``verlmon_flag_active == 1``, open while the series is there at the window's end.

Every query has ONE deadline for its whole answer (connect, wait, every byte; ``timeout``,
default 10 s, or ``VERLMON_PROMETHEUS_TIMEOUT``), not a per-read timeout that a server
dripping bytes resets forever. Every failure is a :class:`SourceError` of one line: the server
unreachable, past the deadline (then the next queries fail at once for ``timeout`` seconds
instead of each waiting again), not JSON, or JSON of a shape this module cannot read.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx
import numpy as np
import pandas as pd
import yaml

from dashboards.sources.alerts import (
    CROSS_NODE_ALERTS,
    FIRING_QUERY,
    SINCE_QUERY,
    ActiveAlert,
    active_alerts,
    alert_flags,
    alert_selector,
    cross_node_flag,
)
from dashboards.sources.base import (
    FLEET_COLUMNS,
    NCCL_COLUMNS,
    ROLLOUT_VIEW_COLUMNS,
    SourceError,
    SourceStatus,
    summarize_nodes,
)
from monitor.api import (
    GPU_COLUMNS,
    HOST_COLUMNS,
    Flag,
    StepRecord,
    bucket_seconds,
    describe_where,
    redact,
    split_url,
)
from monitor.api import metric_names as m

#: Prometheus refuses range queries returning more than this many points per series.
MAX_POINTS_PER_SERIES = 11_000
DEFAULT_SCRAPE_INTERVAL = 15.0
#: How long the first scrape found by ``time_range`` is reused before it is looked up again.
FIRST_SCRAPE_TTL_S = 300.0
#: The deadline of one query, whole answer included, unless ``VERLMON_PROMETHEUS_TIMEOUT`` or
#: the ``timeout`` argument says otherwise (seconds).
DEFAULT_TIMEOUT_S = 10.0
TIMEOUT_ENV = "VERLMON_PROMETHEUS_TIMEOUT"
#: An answer larger than this is refused (a wrong URL streaming a file, not a query result).
MAX_ANSWER_BYTES = 512 * 2**20

log = logging.getLogger(__name__)

#: GPU frame column -> (metric, scale to the interchange unit).
_GPU_QUERIES: dict[str, tuple[str, float]] = {
    "util": (m.GPU_UTIL, 100.0),
    "sm_active": (m.GPU_SM_ACTIVE, 100.0),
    "mem_used_bytes": (m.GPU_MEM_USED, 1.0),
    "mem_total_bytes": (m.GPU_MEM_TOTAL, 1.0),
    "power_w": (m.GPU_POWER, 1.0),
    "tensor_active": (m.GPU_TENSOR_ACTIVE, 100.0),
    "dram_active": (m.GPU_DRAM_ACTIVE, 100.0),
}
_HOST_QUERIES: dict[str, tuple[str, float]] = {
    "cpu_max_core_pct": (m.HOST_CPU_MAX_CORE, 100.0),
    "cpu_avg_pct": (m.HOST_CPU_AVG, 100.0),
    "iowait_pct": (m.HOST_IOWAIT, 100.0),
    "train_rss_bytes": (m.TRAIN_PROC_RSS, 1.0),  # memory_creep on the host (issue 23)
}


def url_problem(url: str) -> str | None:
    """None when ``url`` can name a Prometheus server (http or https with a host), else why
    not, in a few words."""
    try:
        parts = urlsplit(str(url).strip())
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as exc:
        return f"not a URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "not an http(s) URL with a host, e.g. http://localhost:9090"
    return None


def default_timeout() -> float:
    """The per-query deadline: ``VERLMON_PROMETHEUS_TIMEOUT`` seconds when set and positive,
    else DEFAULT_TIMEOUT_S."""
    try:
        value = float(os.environ.get(TIMEOUT_ENV, ""))
    except ValueError:
        return DEFAULT_TIMEOUT_S
    return value if math.isfinite(value) and value > 0 else DEFAULT_TIMEOUT_S


class _Late(SourceError):
    """The deadline passed before the whole answer came."""


#: What a reply of an unexpected shape raises somewhere in the parsing below.
_SHAPE_ERRORS = (KeyError, IndexError, TypeError, ValueError, AttributeError)
_F = TypeVar("_F", bound=Callable[..., Any])


def _guarded(fn: _F) -> _F:
    """``fn`` with an unexpected reply's parsing error turned into one SourceError line."""

    @functools.wraps(fn)
    def call(self: PrometheusSource, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(self, *args, **kwargs)
        except _SHAPE_ERRORS as exc:
            log.debug("reading %s failed", self.url, exc_info=True)
            raise SourceError(self._shape_message(f"{exc.__class__.__name__}: {_reason(exc)}")
                              ) from exc

    return call  # type: ignore[return-value]


def _one_line_errors(cls: type) -> type:
    """Guard every public method of ``cls`` (but ``close``) with :func:`_guarded`."""
    for name, fn in list(vars(cls).items()):
        if not name.startswith("_") and name != "close" and callable(fn):
            setattr(cls, name, _guarded(fn))
    return cls


@_one_line_errors
class PrometheusSource:
    """A :class:`~dashboards.sources.base.MetricSource` over a Prometheus server.

    ``job`` restricts every query to one scrape job. Series are attributed to the ``node``
    label when the target carries one, else to ``instance``.
    """

    kind = "prometheus"

    def __init__(self, url: str, job: str | None = None, timeout: float | None = None) -> None:
        problem = url_problem(url)
        if problem:
            raise SourceError(f"Prometheus URL {redact(url)!r}: {problem}")
        split = split_url(url, "--prometheus")  # user:pass@ goes to basic auth, never shown
        self.url = split.url.rstrip("/")
        self.job = job
        self.label = f"Prometheus {self.url}" + (f" (job {job})" if job else "")
        #: the deadline of one query, whole answer included (seconds)
        self.timeout = float(timeout) if timeout else default_timeout()
        self._client = httpx.Client(base_url=self.url, timeout=self.timeout,
                                    auth=split.auth_pair())
        self._scrape_interval: float | None = None
        self._pool = ThreadPoolExecutor(max_workers=6)
        # the requests themselves run here, so a caller waits for the deadline, not the server
        self._http = ThreadPoolExecutor(max_workers=8, thread_name_prefix="prometheus-http")
        self._late_until: tuple[float, str] | None = None  # (monotonic time, message)
        self._first_scrape: tuple[float, float] | None = None  # (time, when it was looked up)

    # ----------------------------------------------------------------- HTTP plumbing
    def close(self) -> None:
        """Close the HTTP client and worker threads."""
        self._client.close()
        self._pool.shutdown(wait=False)
        self._http.shutdown(wait=False, cancel_futures=True)

    def _get(self, path: str, params: dict) -> dict:
        """The ``data`` object of a successful API answer, all of it within the deadline.

        After a query past its deadline, every query fails at once with the same words until
        ``timeout`` seconds have passed (a hung server must not hold every panel in turn)."""
        late = self._late_until
        if late is not None and time.monotonic() < late[0]:
            raise SourceError(late[1])
        deadline = time.monotonic() + self.timeout
        future = self._http.submit(self._fetch, path, params, deadline)
        try:
            status, raw = future.result(timeout=self.timeout)
        except (FutureTimeout, _Late):
            future.cancel()
            msg = (f"Prometheus at {self.url} did not answer within {self.timeout:g} s (the "
                   "server or a proxy in front of it hangs or sends too slowly); retrying in "
                   f"{self.timeout:g} s")
            self._late_until = (time.monotonic() + self.timeout, msg)
            raise SourceError(msg) from None
        self._late_until = None
        try:
            body = json.loads(raw)
        except ValueError:
            raise SourceError(
                f"Prometheus at {self.url} answered HTTP {status} without JSON") from None
        if not isinstance(body, dict):
            raise SourceError(self._shape_message("the answer is not a JSON object"))
        if body.get("status") != "success":
            error = body.get("error")
            why = _reason(ValueError(error)) if isinstance(error, str) and error else (
                f"HTTP {status}")
            raise SourceError(f"Prometheus query failed: {why}")
        data = body.get("data")
        if not isinstance(data, dict):
            raise SourceError(self._shape_message('"data" is not an object'))
        return data

    def _fetch(self, path: str, params: dict, deadline: float) -> tuple[int, bytes]:
        """(HTTP status, body) read in chunks, stopping at the deadline (on a worker thread)."""
        body = bytearray()
        try:
            with self._client.stream("GET", path, params=params,
                                     timeout=max(deadline - time.monotonic(), 0.001)) as resp:
                for chunk in resp.iter_bytes():
                    body += chunk
                    if time.monotonic() > deadline:
                        raise _Late("past the deadline")
                    if len(body) > MAX_ANSWER_BYTES:
                        raise SourceError(self._shape_message(
                            f"an answer over {MAX_ANSWER_BYTES >> 20} MiB"))
                return resp.status_code, bytes(body)
        except httpx.TimeoutException:
            raise _Late("past the deadline") from None
        except httpx.HTTPError as exc:
            raise SourceError(f"Prometheus unreachable at {self.url}: {_reason(exc)}") from exc

    def _shape_message(self, what: str) -> str:
        return (f"Prometheus at {self.url} answered in a shape verl-monitor cannot read "
                f"({what}); is this the URL of a Prometheus server?")

    def _result(self, data: dict) -> list:
        """``data.result`` checked to be series of labels and ``[time, "value"]`` samples:
        ``value`` in a vector, ``values`` in a matrix (a range query, or an instant query of a
        range selector). The first and last samples of each series are checked; the parsing
        guard covers the rest. A scalar or string result is returned as it came."""
        kind = data.get("resultType")
        result = data.get("result")
        if kind in ("scalar", "string"):
            return result
        sample = "values" if kind == "matrix" else "value"
        if not isinstance(result, list):
            raise SourceError(self._shape_message('"result" is not a list'))
        for series in result:
            if not isinstance(series, dict) or not isinstance(series.get("metric", {}), dict):
                raise SourceError(self._shape_message("a series is not an object with labels"))
            points = series.get(sample)
            points = [points] if sample == "value" else points
            ends = points[:1] + points[-1:] if isinstance(points, list) else [None]
            if not all(_is_sample(p) for p in ends):
                raise SourceError(self._shape_message(
                    f'a series\' "{sample}" are not [time, "number"] pairs'))
        return result

    def _sel(self, extra: str = "") -> str:
        parts = [f'job="{self.job}"'] if self.job else []
        if extra:
            parts.append(extra)
        return "{" + ",".join(parts) + "}"

    def query(self, promql: str, at: float | None = None) -> list[dict]:
        """Instant query; returns the ``result`` list (vectors)."""
        params = {"query": promql}
        if at is not None:
            params["time"] = f"{at:.3f}"
        return self._result(self._get("/api/v1/query", params))

    def query_range(self, promql: str, start: float, end: float, step: float) -> list[dict]:
        """Range query; refuses a step that would return more than 11,000 points a series.

        The range ends at now at the latest: Prometheus answers for a future instant with the
        last value it saw (up to its 5-minute lookback), which drew flat tails past "now"."""
        end = min(float(end), time.time())
        start = min(float(start), end)
        if (end - start) / step + 1 > MAX_POINTS_PER_SERIES:
            step = math.ceil((end - start) / (MAX_POINTS_PER_SERIES - 1))
        params = {"query": promql, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": step}
        return self._result(self._get("/api/v1/query_range", params))

    def scrape_interval(self) -> float:
        """The job's scrape interval from the server's loaded config (15 s if unknown)."""
        if self._scrape_interval is None:
            self._scrape_interval = DEFAULT_SCRAPE_INTERVAL
            try:
                cfg = yaml.safe_load(self._get("/api/v1/status/config", {})["yaml"]) or {}
                value = (cfg.get("global") or {}).get("scrape_interval", "15s")
                for job in cfg.get("scrape_configs") or []:
                    if self.job is None or job.get("job_name") == self.job:
                        value = job.get("scrape_interval", value)
                        break
                self._scrape_interval = _duration_seconds(value)
            except (SourceError, yaml.YAMLError, *_SHAPE_ERRORS):
                pass
        return self._scrape_interval

    def _step(self, start: float, end: float, max_points: int) -> int:
        return bucket_seconds(start, end, max_points, floor_s=self.scrape_interval())

    def _grid(self, start: float, end: float, max_points: int) -> tuple[float, int]:
        """(start, step) of a range query: the step for ``max_points`` and the start moved back
        onto a multiple of it, so successive refreshes ask for the same bucket edges."""
        step = self._step(start, end, max_points)
        return math.floor(start / step) * step, step

    def _series_frame(
        self, results: list[dict], column: str, scale: float = 1.0, keys: Iterable[str] = ()
    ) -> pd.DataFrame:
        """Flatten a query result into rows ``ts, node, *keys, column`` (one pass, no per-series
        frames: 1,024 GPU series must not cost 1,024 DataFrames)."""
        keys = list(keys)
        ts: list = []
        vals: list = []
        nodes: list[str] = []
        extra: dict[str, list] = {k: [] for k in keys}
        for series in results:
            labels = series.get("metric", {})
            values = series.get("values") or ([series["value"]] if "value" in series else [])
            if not values:
                continue
            n = len(values)
            for t, v in values:
                ts.append(t)
                vals.append(v)
            nodes.extend([_node_of(labels)] * n)
            for key in keys:
                extra[key].extend([labels.get(key)] * n)
        df = pd.DataFrame({"ts": np.asarray(ts, dtype=float), "node": nodes, **extra,
                           column: pd.to_numeric(pd.Series(vals, dtype=object), errors="coerce")
                           .to_numpy(dtype=float) * scale})
        return df[["ts", "node", *keys, column]]

    def _range_many(
        self, queries: dict[str, tuple[str, float]], start: float, end: float, step: int,
        keys: Iterable[str],
    ) -> pd.DataFrame:
        """Run range queries concurrently and join their columns on (ts, node, *keys)."""
        keys = list(keys)
        futures = {
            col: self._pool.submit(self.query_range, q, start, end, step)
            for col, (q, _scale) in queries.items()
        }
        index = ["ts", "node", *keys]
        parts = []
        for col, fut in futures.items():
            df = self._series_frame(fut.result(), col, queries[col][1], keys)
            parts.append(df.drop_duplicates(index).set_index(index)[col])
        if not parts:
            return pd.DataFrame()
        return pd.concat(parts, axis=1).reset_index()

    # ----------------------------------------------------------------- MetricSource
    def status(self) -> SourceStatus:
        """"Prometheus unreachable at URL: ...", "no data yet", or ok."""
        try:
            found = self.query(f"count(last_over_time({m.BUILD_INFO}{self._sel()}[1d]))")
        except SourceError as exc:
            return SourceStatus(False, str(exc))
        if not found or float(found[0]["value"][1]) == 0:
            return SourceStatus(False, "no data yet")
        return SourceStatus(True, f"{self.label}: {int(float(found[0]['value'][1]))} exporter(s)")

    def time_range(self, now: float | None = None) -> tuple[float, float] | None:
        """First and last scrape of any exporter within the last day.

        The day is searched at 1-minute resolution, which finds the first scrape at or before
        the first minute boundary after it; a second query at 1-second resolution over the
        minute before that finds the scrape itself (else a run's first minute, or all of a
        run shorter than a minute, would fall outside the range). Before any minute boundary
        has passed since the first scrape, the second query alone finds it. ``now``: the
        instant to ask at (default the current time)."""
        now = time.time() if now is None else float(now)
        sel = self._sel()
        stamp = f"timestamp({m.BUILD_INFO}{sel})"
        last = self.query(f"max({stamp})", at=now)
        if not last:
            last = self.query(f"max(max_over_time({stamp}[1d:1m]))", at=now)
        if not last:
            return None
        hi = float(last[0]["value"][1])
        lo = self._first_scrape_time(stamp, now)
        if lo is None:
            return None
        return (min(lo, hi), hi)

    def _first_scrape_time(self, stamp: str, now: float) -> float | None:
        """The first scrape within the last day; looked up again after FIRST_SCRAPE_TTL_S only
        (the day-long subquery is the dearest query a page refresh makes, and its answer moves
        only when retention drops old samples)."""
        cached = self._first_scrape
        if cached is not None and time.monotonic() - cached[1] < FIRST_SCRAPE_TTL_S:
            return cached[0]
        first = self.query(f"min(min_over_time({stamp}[1d:1m]))", at=now)
        # no minute boundary yet since the first scrape (a run younger than the minute it
        # started in): the day's subquery has no step after it; the last 61 s has it
        lo = float(first[0]["value"][1]) if first else now
        finer = self.query(f"min(min_over_time({stamp}[61s:1s]))", at=lo)
        if finer:
            lo = min(lo, float(finer[0]["value"][1]))
        elif not first:
            return None
        self._first_scrape = (lo, time.monotonic())
        return lo

    def nodes(self) -> list[str]:
        """Nodes with any GPU series in the last day."""
        res = self.query(f"count by (node, instance) (last_over_time({m.GPU_UTIL}{self._sel()}[1d]))")
        return sorted({_node_of(r["metric"]) for r in res})

    def gpu_frame(
        self, start: float, end: float, max_points: int = 1000, node: str | None = None
    ) -> pd.DataFrame:
        """GPU samples per (node, gpu), averaged per step; ``util_min``/``mem_used_bytes_max``
        keep dips and spikes."""
        start, step = self._grid(start, end, max_points)
        sel = self._sel(_node_matcher(node))
        queries = {col: (self._windowed("avg", met + sel, step), sc)
                   for col, (met, sc) in _GPU_QUERIES.items()}
        queries["util_min"] = (self._windowed("min", m.GPU_UTIL + sel, step), 100.0)
        queries["mem_used_bytes_max"] = (self._windowed("max", m.GPU_MEM_USED + sel, step), 1.0)
        df = self._range_many(queries, start, end, step, keys=["gpu"])
        if df.empty:
            return pd.DataFrame(columns=[*GPU_COLUMNS, "util_min", "mem_used_bytes_max"])
        df["gpu"] = pd.to_numeric(df["gpu"], errors="coerce").astype("Int64")
        cols = [*GPU_COLUMNS, "util_min", "mem_used_bytes_max"]
        for col in cols:
            if col not in df.columns:
                df[col] = np.nan
        return df[cols].sort_values(["node", "gpu", "ts"]).reset_index(drop=True)

    def host_frame(
        self, start: float, end: float, max_points: int = 1000, node: str | None = None
    ) -> pd.DataFrame:
        """Host samples per node; disk reads as a rate over the step."""
        start, step = self._grid(start, end, max_points)
        sel = self._sel(_node_matcher(node))
        queries = {col: (self._windowed("avg", met + sel, step), sc)
                   for col, (met, sc) in _HOST_QUERIES.items()}
        window = max(step, int(4 * self.scrape_interval()))
        queries["disk_read_bps"] = (f"rate({m.HOST_DISK_READ}{sel}[{window}s])", 1.0)
        queries["cpu_max_core_pct_max"] = (
            self._windowed("max", m.HOST_CPU_MAX_CORE + sel, step), 100.0)
        queries["iowait_pct_max"] = (self._windowed("max", m.HOST_IOWAIT + sel, step), 100.0)
        df = self._range_many(queries, start, end, step, keys=[])
        cols = [*HOST_COLUMNS, "cpu_max_core_pct_max", "iowait_pct_max"]
        if df.empty:
            return pd.DataFrame(columns=cols)
        for col in cols:
            if col not in df.columns:
                df[col] = np.nan
        return df[cols].sort_values(["node", "ts"]).reset_index(drop=True)

    def _windowed(self, agg: str, selector: str, step: int) -> str:
        if step <= self.scrape_interval():
            return selector
        return f"{agg}_over_time({selector}[{step}s])"

    def steps(self, start: float | None = None, end: float | None = None) -> list[StepRecord]:
        """Steps rebuilt from the step gauges sampled at the scrape interval."""
        rng = self._window(start, end)
        if rng is None:
            return []
        lo, hi = rng
        step = max(self.scrape_interval(), math.ceil((hi - lo) / (MAX_POINTS_PER_SERIES - 1)))
        sel = self._sel()
        queries = {
            "step": m.TRAIN_STEP + sel,
            "end_time": m.LAST_STEP_TS + sel,
            "total": m.STEP_DURATION + sel,
            "throughput": m.THROUGHPUT + sel,
            "mem_reserved_peak_bytes": m.MEM_RESERVED_PEAK + sel,
        }
        futures = {k: self._pool.submit(self.query_range, q, lo, hi, step) for k, q in queries.items()}
        phase_fut = self._pool.submit(self.query_range, m.PHASE_DURATION + sel, lo, hi, step)
        base = None
        for col, fut in futures.items():
            df = self._series_frame(fut.result(), col)
            base = df if base is None else base.merge(df, on=["ts", "node"], how="outer")
        if base is None or base.empty or base["step"].isna().all():
            return []
        phases = self._series_frame(phase_fut.result(), "seconds", keys=["phase"])
        # the node whose log is followed: the one with the most step samples
        node = base.dropna(subset=["step"]).groupby("node").size().idxmax()
        base = base[base["node"] == node].sort_values("ts").reset_index(drop=True)
        key = base["end_time"].fillna(base["step"])
        changed = key.ne(key.shift()) & base["step"].notna()
        rows = base[changed]
        ph = phases[phases["node"] == node].pivot_table(
            index="ts", columns="phase", values="seconds", aggfunc="last"
        )
        out: list[StepRecord] = []
        for _, row in rows.iterrows():
            phase_vals: dict[str, float] = {}
            if row["ts"] in ph.index:
                phase_vals = {
                    str(k): float(v) for k, v in ph.loc[row["ts"]].items() if pd.notna(v)
                }
            # a step cannot end after the scrape that saw it: a node's clock ahead of
            # Prometheus's (or a simulated run played faster, on its own clock) reads as the
            # scrape's time
            end_time = (min(float(row["end_time"]), float(row["ts"]))
                        if pd.notna(row["end_time"]) else row["ts"])
            out.append(
                StepRecord(
                    step=int(row["step"]),
                    end_time=float(end_time),
                    total=_opt(row["total"]),
                    phases=phase_vals,
                    throughput=_opt(row["throughput"]),
                    mem_reserved_peak_bytes=_opt(row["mem_reserved_peak_bytes"]),
                    time_source="arrival",
                    source="prometheus",
                )
            )
        if start is not None:
            out = [s for s in out if s.end_time is None or s.end_time >= start]
        return out

    def _window(self, start: float | None, end: float | None) -> tuple[float, float] | None:
        if start is not None and end is not None:
            return float(start), float(end)
        rng = self.time_range()
        if rng is None:
            return None
        return (rng[0] if start is None else start, rng[1] if end is None else end)

    def flags(
        self, active_only: bool = False, start: float | None = None, end: float | None = None
    ) -> list[Flag]:
        """Flags as the runs of ``verlmon_flag_active == 1``; their whole evidence and advice
        from ``verlmon_flag_info`` (the detectors' advice table when it has none). With alert rules loaded, an
        open flag is open here only while its alert fires, from the moment it began to fire
        (the start Slack shows); the rest are :meth:`pending_flags` (see
        ``dashboards.sources.alerts``). The firing cross-node alerts join them under their names.

        Whether a flag is open is the exporter's own answer at the window's end: its series is
        in the instant vector there. The exporter drops the series the moment the flag closes
        and Prometheus marks it stale at that scrape, so a flag that closed reads closed from
        the first scrape after it closed (not after a run of missing range-query steps)."""
        rng = self._window(start, end)
        if rng is None:
            return []
        lo, hi = rng
        step = self._step(lo, hi, 2000)
        sel = self._sel()
        window = max(int(hi - lo), step)
        futures = {
            "runs": self._pool.submit(self.query_range, f"{m.FLAG_ACTIVE}{sel} == 1", lo, hi,
                                      step),
            "open": self._pool.submit(self.query, f"{m.FLAG_ACTIVE}{sel} == 1", hi),
            "notes": self._pool.submit(
                self.query, f"last_over_time({m.FLAG_INFO}{sel}[{window}s])", hi),
            "rules": self._pool.submit(self._alert_rules),
        }
        res = futures["runs"].result()
        open_now = {_flag_identity(s["metric"]): float(s["value"][0])
                    for s in futures["open"].result()}
        notes = {_flag_identity(s["metric"]): s["metric"] for s in futures["notes"].result()}
        flags: list[tuple[Flag, dict]] = []  # each with its series' labels
        seen: set[tuple[str, ...]] = set()
        for series in res:
            labels = series["metric"]
            ident = _flag_identity(labels)
            seen.add(ident)
            times = [float(t) for t, _v in series.get("values", [])]
            runs = _runs(times, step)
            for i, (run_start, run_end) in enumerate(runs):
                # the last run is open while the series is there at the window's end
                still_open = i == len(runs) - 1 and ident in open_now
                flags.append((_flag_from(labels, notes.get(ident, {}), run_start,
                                         None if still_open else run_end), labels))
        for ident, at in open_now.items():  # opened after the range query's last step
            if ident not in seen:
                labels = next(s["metric"] for s in futures["open"].result()
                              if _flag_identity(s["metric"]) == ident)
                flags.append((_flag_from(labels, notes.get(ident, {}), at, None), labels))
        # the cross-node alerts (nodes without the log are compared in Prometheus): the pages
        # show the same verdict as the alert while it fires
        rules = futures["rules"].result()
        if rules is None:  # no rules API: the firing alerts from ALERTS, the flags as they are
            flags = [f for f, _labels in flags]
            flags += alert_flags(self.query(alert_selector(FIRING_QUERY, self.job), hi),
                                 self.query(alert_selector(SINCE_QUERY, self.job), hi), hi)
        else:
            flags = [f for f, state in _by_alert(flags, *rules) if state == "firing"]
            flags += [cross_node_flag(a) for a in rules[0]
                      if a.name in CROSS_NODE_ALERTS and a.state == "firing"]
        if active_only:
            flags = [f for f in flags if f.end is None]
        return sorted(flags, key=lambda f: f.start, reverse=True)

    def _alert_rules(self) -> tuple[list[ActiveAlert], set[str]] | None:
        """The pending and firing alerts of the job and the flag kinds an alerting rule reads
        (``/api/v1/rules``); None when the server has no rules API to ask."""
        try:
            data = self._get("/api/v1/rules", {"type": "alert"})
        except SourceError as exc:
            if "unreachable" in str(exc) or "did not answer" in str(exc):
                raise
            return None
        return active_alerts(data.get("groups") or [], self.job)

    def pending_flags(self, start: float | None = None, end: float | None = None
                      ) -> list[tuple[Flag, str]]:
        """What is open but does not page, newest first, each with why in words: a pending
        alert (waiting out its ``for:``) or an exporter flag whose alert is not firing (the
        rule holds it back, e.g. ``VerlLowUtilization`` while a straggler alert explains it).
        Empty without alert rules loaded."""
        rng = self._window(start, end)
        if rng is None:
            return []
        hi = rng[1]
        sel = self._sel()
        rules = self._alert_rules()
        if rules is None:
            return []
        window = max(int(hi - rng[0]), int(self.scrape_interval()))
        notes_q = self._pool.submit(self.query,
                                    f"last_over_time({m.FLAG_INFO}{sel}[{window}s])", hi)
        open_now = self.query(f"{m.FLAG_ACTIVE}{sel} == 1", hi)
        notes = {_flag_identity(s["metric"]): s["metric"] for s in notes_q.result()}
        flags = [(_flag_from(s["metric"], notes.get(_flag_identity(s["metric"]), {}),
                             float(s["value"][0]), None), s["metric"]) for s in open_now]
        out = [(f, state) for f, state in _by_alert(flags, *rules) if state != "firing"]
        out += [(cross_node_flag(a), _pending_words(a)) for a in rules[0]
                if a.name in CROSS_NODE_ALERTS and a.state == "pending"]
        return sorted(out, key=lambda fs: fs[0].start, reverse=True)

    def jobs(self) -> list[str]:
        """The scrape jobs holding verl-monitor exporters (within the last day), sorted."""
        res = self.query(f"count by (job) (last_over_time({m.BUILD_INFO}[1d]))")
        return sorted({str(r["metric"].get("job", "")) for r in res} - {""})

    def phase_activity(self, start: float, end: float) -> pd.DataFrame:
        """Per phase over ``[start, end]`` from the exporters' per-phase counters (every 1 s
        sample of theirs, exact at any scrape interval): the GPUs' mean utilization and SM
        activity in the phase, the samples inside it per GPU and its seconds per GPU; the
        columns of ``phase_summary`` (``node`` "all", ``gpu`` 0), its figures withheld where
        the samples are too few. Empty when the exporters publish no such counters."""
        from monitor.api import default_min_phase_samples

        span = max(int(math.ceil(end - start)), int(self.scrape_interval()))
        sel = self._sel()

        def per_gpu(name: str) -> str:
            return f"increase({name}{sel}[{span}s])"

        qs = {"seconds": f"sum by (phase) ({per_gpu(m.PHASE_GPU_SECONDS)})",
              "util": f"sum by (phase) ({per_gpu(m.PHASE_GPU_UTIL_SECONDS)})",
              "sm": f"sum by (phase) ({per_gpu(m.PHASE_GPU_SM_ACTIVE_SECONDS)})",
              "samples": f"sum by (phase) ({per_gpu(m.PHASE_GPU_SAMPLES)})",
              "gpus": f"count by (phase) ({per_gpu(m.PHASE_GPU_SECONDS)} > 0)"}
        futures = {k: self._pool.submit(self.query, q, end) for k, q in qs.items()}
        vals: dict[str, dict[str, float]] = {}
        for k, fut in futures.items():
            vals[k] = {str(r["metric"].get("phase", "")): float(r["value"][1])
                       for r in fut.result()}
        cols = ["phase", "node", "gpu", "util_mean", "sm_mean", "util_p10", "sm_p10", "steps",
                "samples", "full_samples", "seconds", "withheld"]
        min_samples = default_min_phase_samples()
        rows = []
        for phase, secs in sorted(vals["seconds"].items()):
            gpus = vals["gpus"].get(phase, 0.0)
            if not phase or secs <= 0 or gpus <= 0:
                continue
            per = vals["samples"].get(phase, 0.0) / gpus
            held = per < min_samples
            rows.append({
                "phase": phase, "node": "all", "gpu": 0,
                "util_mean": np.nan if held else 100.0 * vals["util"].get(phase, np.nan) / secs,
                "sm_mean": np.nan if held else 100.0 * vals["sm"].get(phase, np.nan) / secs,
                "util_p10": np.nan, "sm_p10": np.nan, "steps": np.nan,
                "samples": per, "full_samples": per, "seconds": secs / gpus,
                "withheld": (f"{_samples_text(per)} per GPU inside it (fewer than {min_samples})"
                             if held else "")})
        return pd.DataFrame(rows, columns=cols)

    def ledger_seconds(self, start: float | None, end: float | None,
                       n_steps: int | None) -> tuple[dict[str, float] | None, int]:
        """GPU-seconds by cause of the last ``n_steps`` steps the exporters' ledger counted in
        the window (every step with None), from ``verlmon_gpu_seconds_total`` and
        ``verlmon_goodput_steps_total`` read at the same scrapes: their increase from the
        last scrape that had ``n_steps`` fewer steps counted to the newest (restarts of a
        counter counted as ``increase()`` does); and how many steps that is. ``(None, 0)``
        when the exporters count no ledger."""
        rng = self._window(start, end)
        if rng is None:
            return None, 0
        lo, hi = rng
        step = max(self.scrape_interval(), math.ceil((hi - lo) / 2000.0))
        sel = self._sel()
        f_causes = self._pool.submit(self.query_range, f"sum by (cause) ({m.GPU_SECONDS}{sel})",
                                     lo, hi, step)
        f_steps = self._pool.submit(self.query_range, f"sum({m.GOODPUT_STEPS}{sel})",
                                    lo, hi, step)
        counted = _points(f_steps.result())
        causes = {str(r["metric"].get("cause", "")): _points([r]) for r in f_causes.result()}
        causes = {c: v for c, v in causes.items() if c and len(v)}
        if not causes or not len(counted):
            return None, 0
        grid = sorted(set(counted.index).union(*(v.index for v in causes.values())))
        if grid[0] > lo + 2 * step:
            # the counters appeared inside the window: their exporter started in it, from 0
            # (what it had counted before its first scrape is in the window too)
            grid = [lo, *grid]
        steps_at = counted.reindex(grid).ffill().fillna(0.0)
        base = 0
        if n_steps:
            target = float(steps_at.iloc[-1]) - n_steps
            before = np.flatnonzero(steps_at.to_numpy() <= target + 1e-9)
            base = int(before[-1]) if len(before) else 0
        seconds = {c: _increase(v.reindex(grid).ffill().fillna(0.0).to_numpy()[base:])
                   for c, v in causes.items()}
        return seconds, int(round(_increase(steps_at.to_numpy()[base:])))

    def run_end(self):
        """The run's end as its exporter says it (``verlmon_run_finished`` 1, with
        ``verlmon_run_end_timestamp_seconds`` and the last ``verlmon_training_step``), or
        None while the run goes on (or no exporter says)."""
        from monitor.api import RunEnd

        sel = self._sel()
        done = self.query(f"max({m.RUN_FINISHED}{sel})")
        if not done or float(done[0]["value"][1]) < 1:
            return None
        at = self.query(f"max({m.RUN_END_TS}{sel})")
        step = self.query(f"max({m.TRAIN_STEP}{sel})")
        if not at:
            return None
        return RunEnd(float(at[0]["value"][1]),
                      int(float(step[0]["value"][1])) if step else None, "")

    def nccl_frame(self, start: float, end: float, max_points: int = 1000) -> pd.DataFrame:
        """NCCL seconds per wall second, bytes per second and bus bandwidth, per collective."""
        start, step = self._grid(start, end, max_points)
        window = max(step, int(4 * self.scrape_interval()))
        sel = self._sel()
        queries = {
            "exec_share": (f"sum by (node, instance, coll) (rate({m.NCCL_EXEC}{sel}[{window}s]))", 1.0),
            "bytes_per_s": (f"sum by (node, instance, coll) (rate({m.NCCL_BYTES}{sel}[{window}s]))", 1.0),
            "busbw_bps": (f"avg by (node, instance, coll) ({m.NCCL_BUSBW}{sel})", 1.0),
        }
        df = self._range_many(queries, start, end, step, keys=["coll"])
        if df.empty:
            return pd.DataFrame(columns=list(NCCL_COLUMNS))
        df["rank"] = np.nan
        return df[list(NCCL_COLUMNS)].sort_values(["node", "coll", "ts"]).reset_index(drop=True)

    def node_summary(self, start: float, end: float) -> pd.DataFrame:
        """Per-node aggregates from instant queries over the whole window (cheap at 128 nodes),
        of the nodes still reporting at its end (every node when none is: the run is over)."""
        span = max(int(end - start), int(self.scrape_interval()))
        sel = self._sel()
        def mean(counter: str, gauge: str) -> str:
            # every sample from the exporter's activity counters (exact at any scrape
            # interval); the scraped gauge only where an older exporter has no counters
            return (f"(increase({counter}{sel}[{span}s]) / (increase({m.GPU_SAMPLED_SECONDS}"
                    f"{sel}[{span}s]) > 0)) or avg_over_time({gauge}{sel}[{span}s])")

        qs = {
            "util": (mean(m.GPU_BUSY_SECONDS, m.GPU_UTIL), 100.0),
            "sm_active": (mean(m.GPU_SM_ACTIVE_SECONDS, m.GPU_SM_ACTIVE), 100.0),
            "mem_used": (f"max_over_time({m.GPU_MEM_USED}{sel}[{span}s])", 1.0),
            "mem_total": (f"max_over_time({m.GPU_MEM_TOTAL}{sel}[{span}s])", 1.0),
        }
        futures = {k: self._pool.submit(self.query, q, end) for k, (q, _s) in qs.items()}
        iow_fut = self._pool.submit(
            self.query, f"avg_over_time({m.HOST_IOWAIT}{sel}[{span}s])", end
        )
        # the nodes still reporting at the window's end: an instant selector drops a series
        # Prometheus marked stale (its target gone from the targets file, or not answering)
        live_fut = self._pool.submit(self.query, f"count by (node, instance) ({m.GPU_UTIL}{sel})",
                                     end)
        per_gpu = None
        for col, fut in futures.items():
            df = self._series_frame(fut.result(), col, qs[col][1], keys=["gpu"]).drop(columns="ts")
            per_gpu = df if per_gpu is None else per_gpu.merge(df, on=["node", "gpu"], how="outer")
        if per_gpu is None or per_gpu.empty:
            return summarize_nodes(
                pd.DataFrame(columns=["node", "gpu", "util", "sm_active", "mem_ratio"])
            )
        for col in ("util", "sm_active", "mem_used", "mem_total"):
            if col not in per_gpu.columns:
                per_gpu[col] = np.nan
        per_gpu["mem_ratio"] = per_gpu["mem_used"] / per_gpu["mem_total"].where(
            per_gpu["mem_total"] > 0
        )
        live = {_node_of(r["metric"]) for r in live_fut.result()}
        if live:  # a node that stopped reporting is not counted (all gone: the run is over)
            per_gpu = per_gpu[per_gpu["node"].isin(live)]
        host = self._series_frame(iow_fut.result(), "iowait_pct", 100.0)
        return summarize_nodes(per_gpu, host)

    def node_frame(self, start: float, end: float, max_points: int = 1000) -> pd.DataFrame:
        """Mean GPU utilization per node over time, aggregated by Prometheus."""
        start, step = self._grid(start, end, max_points)
        q = f"avg by (node, instance) ({self._windowed('avg', m.GPU_UTIL + self._sel(), step)})"
        df = self._series_frame(self.query_range(q, start, end, step), "util", 100.0)
        return df[["ts", "node", "util"]].sort_values(["node", "ts"]).reset_index(drop=True)

    def fleet_frame(
        self, start: float, end: float, max_points: int = 1000, node: str | None = None
    ) -> pd.DataFrame:
        """Mean and lowest utilization across GPUs, aggregated by Prometheus."""
        start, step = self._grid(start, end, max_points)
        sel = self._sel(_node_matcher(node))
        queries = {
            "util_mean": (f"avg({self._windowed('avg', m.GPU_UTIL + sel, step)})", 100.0),
            "util_min": (f"min({self._windowed('min', m.GPU_UTIL + sel, step)})", 100.0),
            "sm_active_mean": (f"avg({self._windowed('avg', m.GPU_SM_ACTIVE + sel, step)})",
                               100.0),
        }
        df = self._range_many(queries, start, end, step, keys=[])
        if df.empty:
            return pd.DataFrame(columns=list(FLEET_COLUMNS))
        for col in FLEET_COLUMNS:
            if col not in df.columns:
                df[col] = np.nan
        return df[list(FLEET_COLUMNS)].sort_values("ts").reset_index(drop=True)

    def hang_culprits(self, start: float, end: float) -> pd.DataFrame:
        """``verlmon_hang_culprit_info`` at ``end``: each exporter's last dump round. A process
        a py-spy round named is said as the store says it (who, where, phase, frame), from its
        ``verlmon_hang_where_info`` series."""
        from dashboards.sources.base import CULPRIT_COLUMNS

        sel = self._sel()
        where = {}
        for r in self.query(f"{m.HANG_WHERE_INFO}{sel} == 1", at=end):
            lab = r.get("metric", {})
            node = lab.get("node") or lab.get("instance", "")
            where[(node, lab.get("pid", ""))] = describe_where(
                lab.get("role", ""), lab.get("pid", ""), node, lab.get("place", ""),
                lab.get("phase", ""), lab.get("frame", ""), lab.get("detail", ""))
        rows = []
        for r in self.query(f"{m.HANG_CULPRIT_INFO}{sel}", at=end):
            lab = r.get("metric", {})
            node = lab.get("node") or lab.get("instance", "")
            said = where.get((node, lab.get("pid", ""))) if not lab.get("rank") else None
            rows.append({"ts": float(end), "node": node,
                         **{k: lab.get(k, "") for k in ("rank", "pid", "gpu", "collective",
                                                        "seq", "frame")},
                         "reason": said or "named by the exporter's last Flight Recorder / "
                                           "py-spy round"})
        return pd.DataFrame(rows, columns=list(CULPRIT_COLUMNS))

    def rollout_frame(self, start: float, end: float, max_points: int = 1000) -> pd.DataFrame:
        """The rollout engines per server from the ``verlmon_rollout_*`` series: gauges
        averaged over each step, counters as rates, latencies as rate(sum) / rate(count)."""
        start, step = self._grid(start, end, max_points)
        window = max(step, int(4 * self.scrape_interval()))
        sel = self._sel()
        by = "by (node, instance, server, engine, model)"

        def avg(selector: str) -> str:
            return f"avg {by} ({self._windowed('avg', selector, step)})"

        def rate(name: str) -> str:
            return f"sum {by} (rate({name}{sel}[{window}s]))"

        queries = {
            "kv_cache_usage": (avg(m.ROLLOUT_KV_CACHE + sel), 1.0),
            "sleeping": (avg(m.ROLLOUT_SLEEPING + sel), 1.0),
            "preemptions_per_s": (rate(m.ROLLOUT_PREEMPTIONS), 1.0),
            "tokens_per_s": (rate(m.ROLLOUT_GEN_TOKENS), 1.0),
            "queue_time_mean_s": (f"{rate(m.ROLLOUT_QUEUE_TIME + '_sum')} / "
                                  f"{rate(m.ROLLOUT_QUEUE_TIME + '_count')}", 1.0),
            "e2e_latency_mean_s": (f"{rate(m.ROLLOUT_E2E_LATENCY + '_sum')} / "
                                   f"{rate(m.ROLLOUT_E2E_LATENCY + '_count')}", 1.0),
        }
        for state in ("running", "waiting", "paused"):
            queries[state] = (avg(m.ROLLOUT_REQUESTS + self._sel(f'state="{state}"')), 1.0)
        df = self._range_many(queries, start, end, step, keys=["server", "engine", "model"])
        if df.empty:
            return pd.DataFrame(columns=list(ROLLOUT_VIEW_COLUMNS))
        for col in ROLLOUT_VIEW_COLUMNS:
            if col not in df.columns:
                df[col] = np.nan
        return (df[list(ROLLOUT_VIEW_COLUMNS)].sort_values(["node", "server", "ts"])
                .reset_index(drop=True))


def _points(results: list[dict]) -> pd.Series:
    """The first series of a range query as values by time (empty when there is none)."""
    for r in results:
        vals = [(float(t), float(v)) for t, v in r.get("values") or () if _is_sample([t, v])]
        if vals:
            ts, vs = zip(*vals, strict=True)
            return pd.Series(vs, index=ts, dtype=float)
    return pd.Series(dtype=float)


def _increase(values: np.ndarray) -> float:
    """How much a counter grew over ``values`` (in time order), a drop counted as a restart
    from zero, as Prometheus's ``increase()`` counts it (without extrapolating)."""
    if len(values) < 2:
        return 0.0
    d = np.diff(values)
    return float(np.where(d >= 0, d, values[1:]).sum())


def _node_of(labels: dict) -> str:
    return str(labels.get("node") or labels.get("instance") or "local")


def _flag_scope(labels: dict) -> dict:
    """A flag's scope from its series labels: the flag's node (the exporter exports it as
    ``node``; Prometheus keeps it as ``exported_node`` when the target has a ``node`` label),
    ``gpus`` from ``gpu`` ("3" or "2,5") and ``phase``."""
    scope: dict = {"node": str(labels.get("exported_node") or _node_of(labels))}
    gpus = [int(v) if v.isdigit() else v for v in str(labels.get("gpu") or "").split(",") if v]
    if gpus:
        scope["gpus"] = gpus
    if labels.get("phase"):
        scope["phase"] = str(labels["phase"])
    return scope


def _flag_from(labels: dict, note: dict, start: float, end: float | None) -> Flag:
    """One flag from its ``verlmon_flag_active`` labels and its ``verlmon_flag_info`` labels
    (``note``; evidence and advice), open when ``end`` is None."""
    minutes = ((end if end is not None else time.time()) - start) / 60.0
    return Flag(
        kind=labels.get("kind", "unknown"),
        severity=labels.get("severity", "warning"),
        start=start,
        end=end,
        scope=_flag_scope(labels),
        evidence=note.get("evidence") or (
            f"verlmon_flag_active was 1 for {minutes:.1f} min "
            f"(from Prometheus; the exporter's store has the full evidence)"
        ),
        advice=_flag_advice(labels.get("kind", ""), note.get("advice", "")),
    )


def _alert_identity(labels: dict) -> tuple[str, ...]:
    """What joins an exporter flag's series to its alert (the rule keeps the flag's labels; a
    rule may set its own severity)."""
    return tuple(str(labels.get(k) or "") for k in
                 ("job", "instance", "kind", "exported_node", "node", "gpu", "phase"))


def _pending_words(alert: ActiveAlert) -> str:
    return f"pending: alert {alert.name} waits out its 'for:' before it fires"


def _by_alert(flags: list[tuple[Flag, dict]], alerts: list[ActiveAlert], kinds: set[str]
              ) -> list[tuple[Flag, str]]:
    """Each flag with its state on the pages: "firing" (closed flags, flags of a kind no alert
    rule reads, and flags whose alert fires, started when it began to fire), else why it does
    not page (pending, or held back by its rule)."""
    ids: dict[tuple[str, ...], ActiveAlert] = {}
    for a in alerts:
        if a.flag_kind and (a.state == "firing" or _alert_identity(a.labels) not in ids):
            ids[_alert_identity(a.labels)] = a
    out = []
    for f, labels in flags:
        if f.end is not None or f.kind not in kinds:
            out.append((f, "firing"))
            continue
        a = ids.get(_alert_identity(labels))
        if a is not None and a.state == "firing":
            out.append((replace(f, start=a.fired_at if a.fired_at is not None else f.start),
                        "firing"))
        elif a is not None:
            out.append((f, _pending_words(a)))
        else:
            out.append((f, "held back: its alert rule does not fire it (another alert explains "
                           "it, or the rule has not been evaluated since it opened)"))
    return out


def _flag_identity(labels: dict) -> tuple[str, ...]:
    """What joins ``verlmon_flag_active`` to its ``verlmon_flag_info``."""
    return tuple(str(labels.get(k) or "") for k in
                 ("job", "instance", "kind", "severity", "exported_node", "node", "gpu", "phase"))


def _flag_advice(kind: str, exported: str) -> list[str]:
    """The flag's own advice as the exporter exports it (``verlmon_flag_info``'s ``advice``, a
    line per piece: the words the store and Slack show); the detectors' advice table for
    ``kind`` only when the exporter sent none (an older exporter, or a flag without advice)."""
    from monitor.api import advice_for

    own = [line.strip() for line in str(exported or "").split("\n") if line.strip()]
    return own or list(advice_for(kind) or [])


def _node_matcher(node: str | None) -> str:
    if not node:
        return ""
    safe = node.replace("\\", "\\\\").replace('"', '\\"')
    return f'node="{safe}"'


def _opt(value) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def _runs(times: list[float], step: float) -> list[tuple[float, float]]:
    """Contiguous runs of sample times (a gap larger than 1.5 steps ends a run)."""
    runs: list[tuple[float, float]] = []
    for t in times:
        if runs and t - runs[-1][1] <= 1.5 * step:
            runs[-1] = (runs[-1][0], t)
        else:
            runs.append((t, t))
    return runs


def _duration_seconds(text: str) -> float:
    """Prometheus duration ("15s", "1m", "500ms", "1m30s") in seconds."""
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
    total, num = 0.0, ""
    i = 0
    text = str(text).strip()
    while i < len(text):
        ch = text[i]
        if ch.isdigit() or ch == ".":
            num += ch
            i += 1
            continue
        unit = "ms" if text.startswith("ms", i) else ch
        if unit not in units or not num:
            raise ValueError(f"bad duration {text!r}")
        total += float(num) * units[unit]
        num = ""
        i += len(unit)
    if num:
        raise ValueError(f"bad duration {text!r}")
    return total


def _is_sample(point: Any) -> bool:
    """True for a ``[time, "value"]`` pair whose both parts read as numbers."""
    if not isinstance(point, (list, tuple)) or len(point) != 2:
        return False
    try:
        float(point[0])
        float(point[1])
    except (TypeError, ValueError):
        return False
    return True


def _reason(exc: Exception) -> str:
    text = str(exc) or exc.__class__.__name__
    return text.splitlines()[0][:200]


def _samples_text(per: float) -> str:
    """A sample count per GPU in words, rounded down so a count under the minimum never
    reads as the minimum ("2.97" is "about 2.97 samples", not "3 samples")."""
    if per == int(per):
        return f"{int(per)} sample{'s' if per != 1 else ''}"
    return f"about {per:.2f} samples" if per < 10 else f"about {int(per)} samples"
