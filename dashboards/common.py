"""Streamlit glue shared by every page: the source, the sidebar settings, cached loaders.

The source comes from the command line after ``--`` (``streamlit run app.py -- --store PATH``
or ``--prometheus URL [--job NAME]``) or from the environment (``VERLMON_STORE``,
``VERLMON_PROMETHEUS``, ``VERLMON_JOB``), which is how ``verl-monitor dashboard`` and the
tests pass it. Query results are cached with ``st.cache_data(ttl=...)`` keyed on the source
and on the window rounded to the refresh interval, so every viewer of a live run shares them.
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import sys
import time
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import streamlit as st

from dashboards.escape import escape_markdown
from dashboards.sources import MetricSource, SourceError, SourceStatus, open_source, steps_to_frame
from monitor.api import Config, Flag, StepRecord, printable

#: Window choices (label -> seconds; None = everything the source holds).
WINDOWS: dict[str, float | None] = {
    "15 min": 900.0,
    "1 h": 3600.0,
    "6 h": 6 * 3600.0,
    "24 h": 86400.0,
    "all": None,
}
#: Live refresh choices (label -> seconds; None = off).
REFRESHES: dict[str, float | None] = {"2 s": 2.0, "5 s": 5.0, "15 s": 15.0, "60 s": 60.0,
                                      "off": None}
MAX_POINTS = 1000
#: How long a loaded frame is kept. The key holds the window, snapped to the refresh interval
#: and ending at the newest sample, so new data is a new key: the entry can never show stale
#: data, and a page opened again later reuses it.
DATA_TTL_S = 600


@dataclass(frozen=True)
class SourceConfig:
    """Which source the app reads; hashable so it can key caches."""

    store: str | None = None
    prometheus: str | None = None
    job: str | None = None

    @property
    def key(self) -> str:
        """A short stable string for cache keys."""
        return f"{self.store}|{self.prometheus}|{self.job}"


def source_config() -> SourceConfig:
    """The source named on the command line after ``--``, else in the environment."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--store")
    parser.add_argument("--prometheus")
    parser.add_argument("--job")
    argv = sys.argv[1:] if sys.argv and sys.argv[0].endswith("app.py") else []
    args, _ = parser.parse_known_args(argv)
    return SourceConfig(
        store=args.store or os.environ.get("VERLMON_STORE") or None,
        prometheus=args.prometheus or os.environ.get("VERLMON_PROMETHEUS") or None,
        job=args.job or os.environ.get("VERLMON_JOB") or None,
    )


@st.cache_resource(show_spinner=False)
def _source(cfg: SourceConfig) -> MetricSource:
    return open_source(store=cfg.store, prometheus=cfg.prometheus, job=cfg.job)


def get_source() -> MetricSource:
    """The shared source object for this server process."""
    return _source(source_config())


@dataclass(frozen=True)
class Settings:
    """The sidebar selections: window length and refresh interval (both in seconds)."""

    window_s: float | None
    refresh_s: float | None
    window_label: str
    refresh_label: str


def sidebar() -> Settings:
    """Window and refresh selectors, bound to the URL so a view can be shared."""
    with st.sidebar:
        window = st.selectbox("Window", list(WINDOWS), index=1, key="window",
                              bind="query-params",
                              help="How far back from the newest sample the pages look.")
        refresh = st.selectbox("Live refresh", list(REFRESHES), index=1, key="refresh",
                               bind="query-params",
                               help="How often the data panels reload (only they rerun).")
        st.caption(source_config_label())
        mixed_jobs_warning()
    return Settings(WINDOWS[window], REFRESHES[refresh], window, refresh)


@st.cache_data(ttl=30, show_spinner=False, max_entries=8)
def load_jobs(key: str) -> list[str]:
    """The scrape jobs holding exporters (Prometheus; none from a store)."""
    try:
        return get_source().jobs()
    except SourceError:
        return []


def mixed_jobs_warning() -> None:
    """Say so when Prometheus holds several jobs and no ``--job`` picks one: every page would
    mix their nodes, steps and flags."""
    cfg = source_config()
    if not cfg.prometheus or cfg.job:
        return
    jobs = load_jobs(cfg.key)
    if len(jobs) > 1:
        names = ", ".join(escape_markdown(j) for j in jobs)
        st.warning(f"Prometheus holds {len(jobs)} jobs ({names}): the pages mix "
                   "them. Pick one: `verl-monitor dashboard --prometheus URL --job NAME`.",
                   icon=":material/call_split:")


def source_config_label() -> str:
    """Where the app reads from, in words (the Prometheus job named on every page)."""
    cfg = source_config()
    if cfg.prometheus:
        return (f"Source: Prometheus {escape_markdown(cfg.prometheus)}, "
                + (f"job **{escape_markdown(cfg.job)}**" if cfg.job else "every job (no --job)"))
    if cfg.store:
        return f"Source: run store {cfg.store}"
    return "Source: none configured"


def _quantum(refresh_s: float | None) -> float:
    return float(refresh_s or 5.0)


def _snap(cached):
    """Call a cached loader with its window snapped outward to the refresh interval, so every
    viewer and every refresh within one interval shares one answer (the pages pin their axes to
    the exact window; no source holds data past its newest sample, and the Prometheus source
    never asks past now)."""

    @functools.wraps(cached)
    def call(key: str, start: float | None, end: float | None, *args, **kwargs):
        q = _quantum(settings().refresh_s)
        if start is not None:
            start = math.floor(start / q) * q
        if end is not None:
            end = math.ceil(end / q) * q
        return cached(key, start, end, *args, **kwargs)

    return call


def store_stamp(cfg: SourceConfig | None = None) -> tuple:
    """What changes whenever the run store is written: size and mtime of the SQLite file and
    of its write-ahead log (``()`` for Prometheus, or when the store is missing). Store reads
    keyed on it are reused until the next write, and never after it."""
    cfg = cfg or source_config()
    if not cfg.store or cfg.prometheus:
        return ()
    stamp = []
    for path in (cfg.store, cfg.store + "-wal"):
        try:
            st_ = os.stat(path)
            stamp += [st_.st_mtime_ns, st_.st_size]
        except OSError:
            stamp += [None, None]
    return tuple(stamp)


def _read_status() -> SourceStatus:
    try:
        return get_source().status()
    except SourceError as exc:
        return SourceStatus(False, str(exc))


@st.cache_data(ttl=2, show_spinner=False)
def _status(key: str, stamp: tuple) -> SourceStatus:
    return _read_status()


def load_status(key: str) -> SourceStatus:
    """Source status (cached for 2 s; a store's until it is next written)."""
    stamp = store_stamp()
    return (_status_by_stamp if stamp else _status)(key, stamp)


@st.cache_data(ttl=DATA_TTL_S, show_spinner=False, max_entries=16)
def _status_by_stamp(key: str, stamp: tuple) -> SourceStatus:
    return _read_status()


@st.cache_data(ttl=2, show_spinner=False)
def _time_range(key: str, stamp: tuple) -> tuple[float, float] | None:
    return get_source().time_range()


@st.cache_data(ttl=DATA_TTL_S, show_spinner=False, max_entries=16)
def _time_range_by_stamp(key: str, stamp: tuple) -> tuple[float, float] | None:
    return get_source().time_range()


def load_time_range(key: str) -> tuple[float, float] | None:
    """Source time range (cached for 2 s; a store's until it is next written)."""
    stamp = store_stamp()
    return (_time_range_by_stamp if stamp else _time_range)(key, stamp)


def current_window(settings: Settings) -> tuple[float, float] | None:
    """The window to show, ending at the newest sample ("now" for the data: charts never run
    past it); renders the status message and returns None when the source cannot answer
    ("store missing", "Prometheus unreachable", "no data yet").

    The start is rounded down to the refresh interval so viewers share cached answers; the
    end is the source's newest sample, read once per refresh: every panel of the refresh is
    given the same window, so the numbers on one screen come from one snapshot."""
    cfg = source_config()
    if not cfg.store and not cfg.prometheus:
        st.error("No source configured: start with `verl-monitor dashboard --store PATH` or "
                 "`--prometheus URL`.")
        return None
    status = load_status(cfg.key)
    if not status.ok:
        show_status(status)
        return None
    try:
        rng = load_time_range(cfg.key)
    except SourceError as exc:
        show_status(SourceStatus(False, str(exc)))
        return None
    if rng is None:
        show_status(SourceStatus(False, "no data yet"))
        return None
    q = _quantum(settings.refresh_s)
    end = float(rng[1])
    start = rng[0] if settings.window_s is None else max(rng[0], end - settings.window_s)
    start = min(math.floor(start / q) * q, end)
    return float(start), end


def show_status(status: SourceStatus) -> None:
    """The page body when the source cannot answer, in words that say what to do."""
    msg = status.message
    if msg.startswith("no data yet"):
        st.info("No data yet: the exporter has not written any sample. This page fills in "
                "as soon as it does.", icon=":material/hourglass_empty:")
    elif msg.startswith("store missing"):
        st.warning(f"{msg}. Start the exporter with `--store` pointing here, or run "
                   "`verl-monitor demo`.", icon=":material/folder_off:")
    elif "unreachable" in msg:
        st.error(f"{msg}. Check the URL and that Prometheus is running.", icon=":material/cloud_off:")
    else:
        st.error(msg)


@_snap
@st.cache_data(ttl=DATA_TTL_S, show_spinner=False, max_entries=64)
def load_gpu(key: str, start: float, end: float, max_points: int = MAX_POINTS,
             node: str | None = None) -> pd.DataFrame:
    """GPU frame of the window, downsampled by the source."""
    return get_source().gpu_frame(start, end, max_points, node)


@_snap
@st.cache_data(ttl=DATA_TTL_S, show_spinner=False, max_entries=64)
def load_host(key: str, start: float, end: float, max_points: int = MAX_POINTS,
              node: str | None = None) -> pd.DataFrame:
    """Host frame of the window."""
    return get_source().host_frame(start, end, max_points, node)


@_snap
@st.cache_data(ttl=DATA_TTL_S, show_spinner=False, max_entries=64)
def load_steps(key: str, start: float | None, end: float | None) -> list[StepRecord]:
    """Steps that ended in the window, without their raw metrics dict (the pages read only
    phases, totals and throughput; this keeps the cached value small to copy)."""
    return [replace(s, metrics={}) for s in get_source().steps(start, end)]


def steps_frame(steps: list[StepRecord]) -> pd.DataFrame:
    """Steps as a flat frame (see ``steps_to_frame``)."""
    return steps_to_frame(steps)


@_snap
@st.cache_data(ttl=DATA_TTL_S, show_spinner=False, max_entries=64)
def load_steps_frame(key: str, start: float | None, end: float | None) -> pd.DataFrame:
    """Steps of the window as a flat frame (cached)."""
    return steps_to_frame(load_steps(key, start, end))


def _last_steps(key: str, start: float, end: float,
                steps_end: float | None) -> list[StepRecord]:
    """The steps of ``[start, end]`` for the last-steps loaders. They are called with ``end`` at
    the last step's end (their answer holds until a new step arrives); ``steps_end``, the
    page's own window end (left out of their cache keys: its name starts with "_"), reads the
    steps through the page's cached ``load_steps`` call instead of a second query of its own:
    no step ends between the last step's end and the window's end."""
    if steps_end is None:
        return load_steps(key, start, end)
    return [s for s in load_steps(key, start, steps_end)
            if s.end_time is None or s.end_time <= end]


#: Steps the per-phase attribution and the Overview's GPU-time bar look back over.
ATTRIB_STEPS = 20


def config_path() -> str | None:
    """The ``--config`` file given to ``verl-monitor dashboard`` (``VERLMON_CONFIG``), if any."""
    return os.environ.get("VERLMON_CONFIG") or None


@st.cache_data(ttl=30, show_spinner=False, max_entries=8)
def _run_config(key: str, path: str | None, stamp: tuple) -> Config:
    from monitor.api import load_config

    if path:
        return load_config(path)
    cfg = source_config()
    if cfg.store and not cfg.prometheus and os.path.exists(cfg.store):
        from monitor.api import RunStore

        try:
            with RunStore(cfg.store, create=False) as rs:
                saved = rs.meta().get("config")
        except Exception:  # noqa: BLE001 - an unreadable meta falls back to the defaults
            saved = None
        if isinstance(saved, dict):
            base = load_config()
            return Config({**base, **saved})
    return load_config()


def run_config() -> Config:
    """The config every analysis on the pages runs under, the one the exporter and ``analyze``
    use: ``dashboard --config FILE``, else the config the exporter saved in its store (its own
    ``--config``), else the packaged defaults. So a ``goodput:`` override moves the bar, the
    goodput figure and ``verlmon_gpu_seconds_total`` alike."""
    path = config_path()
    return _run_config(key(), path, () if path else store_stamp())


@st.cache_data(ttl=30, show_spinner=False, max_entries=8)
def _run_job_config(key: str, stamp: tuple) -> dict | None:
    cfg = source_config()
    if not cfg.store or cfg.prometheus or not os.path.exists(cfg.store):
        return None
    from monitor.api import RunStore

    try:
        with RunStore(cfg.store, create=False) as rs:
            saved = rs.meta().get("job_config")
    except Exception:  # noqa: BLE001 - an unreadable meta: no printed config
        return None
    return saved if isinstance(saved, dict) else None


def run_job_config() -> dict | None:
    """The job's config as verl printed it, as the exporter found it in the log it followed
    and saved in its store (meta ``job_config``): its trainer mode decides where the step keys
    cannot (verl 0.9's V1 separate-async trainer prints the sync trainer's keys), as in
    ``analyze`` and on ``/metrics``. None from a store without it, and from Prometheus: there
    is no log there and the exporters keep no printed config, so the pages judge the mode
    from the step keys alone."""
    return _run_job_config(key(), store_stamp())


def _attribution_samples(key: str, steps: list[StepRecord], start: float, end: float,
                         node: str | None, fleet: bool) -> pd.DataFrame:
    """GPU samples (or the mean across GPUs when ``fleet``) over the steps, at the sampling
    resolution (every sample of a store, as ``analyze`` reads them from its export);
    Prometheus values are moved to the middle of their interval."""
    a_start = max(min(s.end_time - (s.total or 0) for s in steps if s.end_time) - 1, start)
    points = int(max(end - a_start, 1.0)) + 1
    if not fleet and get_source().kind != "prometheus":
        points *= 8  # a store returns its samples as they are below this (0.125 s apart)
    if fleet:
        frame = load_fleet(key, a_start, end, points, node)
        frame = frame.rename(columns={"util_mean": "util", "sm_active_mean": "sm_active"})
        frame = frame.assign(node="all", gpu=0)
    else:
        frame = load_gpu(key, a_start, end, points, node)
    if get_source().kind == "prometheus" and len(frame):
        from monitor.api import sample_period

        frame = frame.assign(ts=frame["ts"] - sample_period(frame["ts"]) / 2)
    return frame


@_snap
@st.cache_data(ttl=DATA_TTL_S, show_spinner=False, max_entries=32)
def load_attribution(key: str, start: float, end: float, last_step_end: float,
                     node: str | None = None, n_steps: int = ATTRIB_STEPS,
                     fleet: bool = False, _steps_end: float | None = None) -> pd.DataFrame:
    """Per phase and GPU utilization over the last ``n_steps`` steps (``phase_summary``, with
    sample counts and withheld phases); with ``fleet`` for the mean across GPUs (one row per
    phase, cheap on any cluster). Recomputed only when a new step has arrived
    (``last_step_end`` is part of the key). See :func:`_last_steps` for ``_steps_end``."""
    from monitor.api import RunAnalysis

    recent = _analysis_steps(key, start, end, _steps_end)[-n_steps:]
    if not recent:
        return pd.DataFrame()
    samples = _attribution_samples(key, recent, start, end, node, fleet)
    return RunAnalysis(recent, samples, config=run_config(),
                       job_config=run_job_config()).phase_summary()


def _analysis_steps(key: str, start: float, end: float,
                    steps_end: float | None) -> list[StepRecord]:
    """The timed steps of ``[start, end]`` with their metrics (the analyses read the trainer
    mode, the weight sync's timer and the response lengths from them), as ``analyze`` sees
    them; read through one cached query per new step."""
    return [s for s in _full_steps(key, start, steps_end if steps_end is not None else end)
            if s.end_time is not None and s.end_time <= end]


@_snap
@st.cache_data(ttl=DATA_TTL_S, show_spinner=False, max_entries=16)
def _full_steps(key: str, start: float | None, end: float | None) -> list[StepRecord]:
    return get_source().steps(start, end)


@_snap
@st.cache_data(ttl=DATA_TTL_S, show_spinner=False, max_entries=32)
def load_steps_util(key: str, start: float, end: float, last_step_end: float,
                    n_steps: int = ATTRIB_STEPS, _steps_end: float | None = None) -> float | None:
    """The GPUs' mean utilization (%) over the last ``n_steps`` steps, every sample inside a
    step counted whatever its phase (the mean across GPUs; None without samples). Phases too
    short to measure one by one get their busy share from it on the Overview."""
    recent = [s for s in _last_steps(key, start, end, _steps_end)
              if s.end_time is not None][-n_steps:]
    if not recent:
        return None
    samples = _attribution_samples(key, recent, start, end, None, True)
    if samples is None or len(samples) == 0:
        return None
    ts = samples["ts"].to_numpy(dtype=float)
    inside = np.zeros(len(ts), dtype=bool)
    for s in recent:
        inside |= (ts >= s.end_time - (s.total or 0.0)) & (ts <= s.end_time)
    util = samples.loc[inside, "util"].dropna()
    return float(util.mean()) if len(util) else None


@functools.lru_cache(maxsize=1)
def phase_min_samples() -> int:
    """Samples wholly inside a phase below which its figures are withheld
    (``dashboard.phase_min_samples`` of ``monitor/defaults.yaml``, read once)."""
    from monitor.api import default_min_phase_samples

    return default_min_phase_samples()


def withheld_text(summary: pd.DataFrame) -> str:
    """"reward (0 samples), adv (1 sample)": the withheld phases of an attribution summary
    with the samples wholly inside each ("" when none is withheld)."""
    if summary is None or not len(summary) or "withheld" not in summary.columns:
        return ""
    held = summary[summary["withheld"] != ""]
    counts = held.groupby("phase", sort=False)["full_samples"].min()
    return ", ".join(f"{p} ({int(n)} sample{'' if int(n) == 1 else 's'})"
                     for p, n in counts.items())


@_snap
@st.cache_data(ttl=DATA_TTL_S, show_spinner=False, max_entries=32)
def load_goodput(key: str, start: float, end: float, last_step_end: float,
                 n_steps: int = ATTRIB_STEPS, _steps_end: float | None = None) -> pd.DataFrame:
    """The goodput ledger (``monitor.analysis.goodput.ledger``) of the last ``n_steps`` steps,
    per step and GPU (the mean across GPUs from Prometheus, cheap on any cluster), under
    :func:`run_config` and the job's printed config (:func:`run_job_config`; none from
    Prometheus). Recomputed only when a new step has arrived."""
    from monitor.api import RunAnalysis, last_steps

    stored = getattr(get_source(), "ledger_frame", None)
    counted = stored(start, end) if stored is not None else pd.DataFrame()
    if len(counted):  # as the exporter counted it: the seconds behind the headline
        return last_steps(counted, n_steps)
    recent = _analysis_steps(key, start, end, _steps_end)
    recent = recent[-(n_steps + 1):]  # one more: the first step's wall time starts at it
    if len(recent) < 2:
        return pd.DataFrame()
    fleet = get_source().kind == "prometheus"
    samples = _attribution_samples(key, recent, start, end, None, fleet)
    if samples is None or len(samples) == 0:
        return pd.DataFrame()
    flags = load_flags(key, False, recent[0].end_time, end)
    led = RunAnalysis(recent, samples, config=run_config(), flags=flags,
                      job_config=run_job_config()).ledger()
    return led[led["step"] != recent[0].step] if len(led) else led


def _run_end_now(key: str, stamp: tuple):
    try:
        return get_source().run_end()
    except SourceError:
        raise
    except Exception:  # noqa: BLE001 - a source that cannot say: the run goes on
        return None


@st.cache_data(ttl=2, show_spinner=False)
def _run_end(key: str, stamp: tuple):
    return _run_end_now(key, stamp)


@st.cache_data(ttl=DATA_TTL_S, show_spinner=False, max_entries=16)
def _run_end_by_stamp(key: str, stamp: tuple):
    return _run_end_now(key, stamp)


def load_run_end(key: str):
    """The run's end (``RunEnd``: time, last step, what said so) as the exporter saw it, or
    None while it goes on (cached for 2 s; a store's until it is next written)."""
    stamp = store_stamp()
    return (_run_end_by_stamp if stamp else _run_end)(key, stamp)


def finished_text(end) -> str:
    """"Finished at 2026-12-03 10:19:48 UTC after step 42 (the job exited ...)": the line
    every page shows once the run has ended."""
    return f"Finished {end.words()}: the run is over; nothing new opens."


def _ledger_seconds(key: str, start: float, end: float, n_steps: int | None,
                    last_step_end: float) -> tuple[dict | None, int]:
    """The span's GPU-seconds by cause as the exporters counted them (the store's ledger, or
    the counters in Prometheus); else, for a store without them, the ledger computed from its
    samples (``load_goodput``)."""
    seconds, counted = get_source().ledger_seconds(start, end, n_steps)
    if seconds is not None:
        return seconds, counted
    if get_source().kind != "store":
        return None, 0
    from monitor.api import cause_seconds

    led = load_goodput(key, start, end, last_step_end, n_steps or 100_000, _steps_end=end)
    if not len(led):
        return None, 0
    return cause_seconds(led), int(led[["step", "end"]].drop_duplicates().shape[0])


@_snap
@st.cache_data(ttl=DATA_TTL_S, show_spinner=False, max_entries=32)
def load_ledger_seconds(key: str, start: float, end: float, n_steps: int | None,
                        last_step_end: float, stamp: tuple = ()) -> tuple[dict | None, int]:
    """Cached :func:`_ledger_seconds` (the key moves with each new step and store write)."""
    return _ledger_seconds(key, start, end, n_steps, last_step_end)


def load_headline(key: str, start: float, end: float, flags: list[Flag],
                  last_step_end: float | None):
    """The headline (``monitor.analysis.headline``) the page leads with: the last steps' ledger
    of a live run (the whole window's of a finished one), the open flags, the run's end;
    the same computation and numbers in both modes (``dashboards/headline_data.py``)."""
    from dashboards.headline_data import source_headline
    from monitor.api import SPAN_STEPS

    run_end = load_run_end(key)
    n_steps = None if run_end is not None else SPAN_STEPS
    seconds: tuple[dict | None, int] = (None, 0)
    if last_step_end is not None:
        seconds = load_ledger_seconds(key, start, end, n_steps, last_step_end,
                                      stamp=store_stamp())
    return source_headline(_Known(get_source(), run_end, load_time_range(key)), start, end,
                           flags, run_config().section("suppress"), seconds)


class _Known:
    """A source whose run end and time range this refresh has read already (cached)."""

    def __init__(self, source, run_end, rng) -> None:
        self._source, self._end, self._rng = source, run_end, rng

    def run_end(self):
        return self._end

    def time_range(self):
        return self._rng

    def ledger_seconds(self, *args):
        return self._source.ledger_seconds(*args)


#: The banner's Streamlit call and icon for each headline state.
BANNERS: dict[str, tuple[str, str]] = {
    "healthy": ("success", ":material/check_circle:"),
    "warning": ("warning", ":material/warning:"),
    "critical": ("error", ":material/error:"),
    "finished": ("info", ":material/flag_circle:"),
}


def page_headline(key: str, start: float, end: float, flags: list[Flag] | None = None):
    """Draw the headline's banner (the Overview's, on the Flags page too) and return the
    headline: ``flags`` are the window's flags (loaded when None)."""
    if flags is None:
        flags = load_flags(key, False, start, end)
    df = load_steps_frame(key, start, end)
    last_end = (float(df["end_time"].iloc[-1])
                if len(df) and pd.notna(df["end_time"].iloc[-1]) else None)
    head = load_headline(key, start, end, open_flags(flags), last_end)
    call, icon = BANNERS.get(head.state, BANNERS["warning"])
    getattr(st, call)(head.text, icon=icon)
    return head


@st.cache_data(ttl=DATA_TTL_S, show_spinner=False, max_entries=32)
def load_phase_activity(key: str, start: float, end: float) -> pd.DataFrame:
    """Per phase over ``[start, end]`` (the last steps: the key changes once a step) from the
    exporters' per-phase counters (Prometheus; empty from a store or without the counters):
    the mean GPU's utilization in each phase."""
    return get_source().phase_activity(start, end)


def attribution_caption(summary: pd.DataFrame, n_steps: int) -> str:
    """What the attribution figures rest on, and which phases were withheld and why."""
    text = (f"Last {n_steps} steps; each sample counts toward a phase by the time it overlaps "
            "the phase (phases laid out as verl runs them, ending at the step's end).")
    if summary is not None and len(summary) and "withheld" in summary.columns:
        held = sorted(set(summary.loc[summary["withheld"] != "", "phase"]))
        if held:
            n = int(summary.loc[summary["phase"].isin(held), "full_samples"].max())
            text += (f" Withheld: {', '.join(held)} (at most {n} sample(s) wholly inside; the "
                     "phase is shorter than the sampling interval).")
    return text


def load_hang_culprits(key: str, start: float, end: float) -> pd.DataFrame:
    """Who holds a hung job (``MetricSource.hang_culprits``), read when a hang flag shows;
    its text (frames from py-spy dumps) made printable."""
    frame = get_source().hang_culprits(start, end)
    for col in frame.columns:
        if frame[col].dtype == object:
            frame[col] = [printable(v) if isinstance(v, str) else v for v in frame[col]]
    return frame


def inert_flag(flag: Flag) -> Flag:
    """``flag`` with its text from outside (evidence, advice, scope: log lines, frames, node
    names) made printable (``monitor.printable``), for every table, card and chart."""
    scope = {k: printable(v) if isinstance(v, str) else v for k, v in flag.scope.items()}
    return replace(flag, kind=printable(flag.kind), scope=scope,
                   evidence=printable(flag.evidence), advice=[printable(a) for a in flag.advice])


def load_flags(key: str, active_only: bool = False, start: float | None = None,
               end: float | None = None) -> list[Flag]:
    """Flags overlapping the window, newest first: a flag is open on a page exactly while it
    is open in the source. From Prometheus they are read on every call; from a store they
    are reused until the store is next written (keyed on :func:`store_stamp`)."""
    stamp = store_stamp()
    if not stamp:
        return [inert_flag(f) for f in get_source().flags(active_only, start, end)]
    return _flags_by_stamp(key, stamp, active_only, start, end)


@st.cache_data(ttl=DATA_TTL_S, show_spinner=False, max_entries=64)
def _flags_by_stamp(key: str, stamp: tuple, active_only: bool, start: float | None,
                    end: float | None) -> list[Flag]:
    return [inert_flag(f) for f in get_source().flags(active_only, start, end)]


def load_pending(key: str, start: float | None = None,
                 end: float | None = None) -> list[tuple[Flag, str]]:
    """What is open but does not page (pending alerts, flags their rule holds back), with why,
    newest first; read on every call like the Prometheus flags (a store has none)."""
    if store_stamp():
        return []
    return [(inert_flag(f), printable(why)) for f, why in get_source().pending_flags(start, end)]


@functools.lru_cache(maxsize=1)
def _suppress_rules() -> dict[str, tuple[str, ...]]:
    from monitor.api import load_config

    return {k: tuple(v or ()) for k, v in load_config().section("suppress").items()}


def explains(cause: Flag, effect: Flag) -> bool:
    """True when ``cause`` names what ``effect`` is a consequence of (``suppress`` of
    ``monitor/defaults.yaml``: a straggler explains its waiting peers' low activity); a
    cross-node alert counts as the flag kind it is (``GPUStraggler`` as ``gpu_imbalance``)."""
    from dashboards.sources.alerts import base_kind

    return base_kind(cause.kind) in _suppress_rules().get(base_kind(effect.kind), ())


def rank_flags(flags: list[Flag]) -> list[Flag]:
    """Open flags in the order to act on them: most severe first; within a severity, a cause
    before the flags it explains (the straggler before the waiting GPUs' flags), then the
    newest."""
    from monitor.api import SEVERITIES

    sev = {s: i for i, s in enumerate(reversed(SEVERITIES))}

    def order(f: Flag) -> tuple:
        peers = [g for g in flags if g is not f and g.severity == f.severity]
        explained = any(explains(g, f) for g in peers)
        n_explains = sum(explains(f, g) for g in peers)
        return (sev.get(f.severity, 99), explained, -n_explains, -f.start)

    return sorted(flags, key=order)


#: How the GPUs heat map and table call a GPU a flag covers (flag kind -> word); others by kind.
GPU_MARKS: dict[str, str] = {"GPUStraggler": "STRAGGLER", "NodeImbalance": "SLOW NODE",
                             "low_utilization": "LOW UTIL", "util_overstates_sm": "UTIL > SM",
                             "memory_pressure": "MEM FULL", "memory_creep": "MEM GROWS",
                             "gpu_fault": "FAULT"}


def gpu_mark(flag: Flag) -> str:
    """The word a GPU heat map writes beside a GPU ``flag`` covers: STRAGGLER for the GPU the
    others wait for (a straggler alert, or a gpu_imbalance flag naming the straggler), BELOW
    PEERS for a GPU well below its peers, else the flag's kind in a word or two."""
    if flag.kind == "gpu_imbalance":
        return "STRAGGLER" if "straggler" in (flag.evidence or "").lower() else "BELOW PEERS"
    return GPU_MARKS.get(flag.kind, flag.kind.replace("_", " ").upper())


def open_flags(flags: list[Flag]) -> list[Flag]:
    """The flags still open (``end`` None), in the given order."""
    return [f for f in flags if f.end is None]


def flags_on_gpu(flags: list[Flag], node: str, gpu: int, single_node: bool) -> list[Flag]:
    """Open flags whose scope covers ``node``/``gpu``: the node named (or none named on a
    one-node run) and the GPU listed (or no GPU list: the whole node)."""
    out = []
    for f in open_flags(flags):
        f_node = f.scope.get("node")
        if f_node is not None and str(f_node) != str(node):
            continue
        if f_node is None and not single_node:
            continue
        gpus = f.scope.get("gpus")
        if gpus and int(gpu) not in {int(g) for g in gpus if str(g).lstrip("-").isdigit()}:
            continue
        out.append(f)
    return out


@_snap
@st.cache_data(ttl=DATA_TTL_S, show_spinner=False, max_entries=64)
def load_nccl(key: str, start: float, end: float, max_points: int = MAX_POINTS) -> pd.DataFrame:
    """NCCL frame of the window."""
    return get_source().nccl_frame(start, end, max_points)


@_snap
@st.cache_data(ttl=DATA_TTL_S, show_spinner=False, max_entries=64)
def load_rollout(key: str, start: float, end: float, max_points: int = MAX_POINTS) -> pd.DataFrame:
    """Rollout engines per bucket and server (``ROLLOUT_VIEW_COLUMNS``) for the Rollout page."""
    return get_source().rollout_frame(start, end, max_points)


@_snap
@st.cache_data(ttl=DATA_TTL_S, show_spinner=False, max_entries=32)
def load_node_summary(key: str, start: float, end: float) -> pd.DataFrame:
    """Per-node aggregates over the window."""
    return get_source().node_summary(start, end)


@_snap
@st.cache_data(ttl=DATA_TTL_S, show_spinner=False, max_entries=32)
def load_node_frame(key: str, start: float, end: float, max_points: int = 300) -> pd.DataFrame:
    """Per-node mean utilization over time."""
    return get_source().node_frame(start, end, max_points)


@_snap
@st.cache_data(ttl=DATA_TTL_S, show_spinner=False, max_entries=64)
def load_fleet(key: str, start: float, end: float, max_points: int = MAX_POINTS,
               node: str | None = None) -> pd.DataFrame:
    """Mean and lowest GPU utilization across GPUs (or one node's) over time."""
    return get_source().fleet_frame(start, end, max_points, node)


@st.cache_data(ttl=10, show_spinner=False, max_entries=8)
def load_nodes(key: str) -> list[str]:
    """Node names."""
    return get_source().nodes()


@st.cache_data(ttl=DATA_TTL_S, show_spinner=False, max_entries=128)
def _figure_spec(name: str, args: tuple, kwargs: dict) -> dict:
    from dashboards import charts

    return getattr(charts, name)(*args, **kwargs).to_plotly_json()


def chart(name: str, *args, key: str, **kwargs) -> None:
    """Draw ``charts.<name>(*args, **kwargs)``, the figure built once per distinct input and
    reused as its JSON (building a figure with plotly's validators costs 30-250 ms, more than
    the cached data behind it)."""
    spec = _figure_spec(name, args, kwargs)
    if not spec.get("data"):  # st.plotly_chart refuses a dict without traces
        from dashboards import charts

        spec = getattr(charts, name)(*args, **kwargs)
    st.plotly_chart(spec, key=key, width="stretch")


def chosen_tab(labels: list[str], key: str):
    """Tabs of which only the selected one runs and is drawn: returns its label and its
    container. The choice is bound to the URL as ``key`` (a link opens the same tab), and the
    first tab is the default. A page so draws one chart, not every chart it offers (each
    Plotly chart costs the browser about 0.2 s on a 2-core machine; ``bench/dashboard.py``)."""
    tabs = st.tabs(labels, key=key, bind="query-params")
    for label, tab in zip(labels, tabs, strict=True):
        if tab.open:
            return label, tab
    return labels[0], tabs[0]


def key() -> str:
    """Cache key of the configured source."""
    return source_config().key


def fmt_time(ts: float | None) -> str:
    """Unix seconds as ``HH:MM:SS`` UTC (``open`` for None)."""
    if ts is None:
        return "open"
    return time.strftime("%H:%M:%S", time.gmtime(ts))


def fmt_duration(seconds: float | None) -> str:
    """Seconds in words a person reads at a glance."""
    if seconds is None or pd.isna(seconds):
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def flag_title(flag: Flag, severity: bool = True) -> str:
    """"[WARNING] io_starvation - node=n0 - 10:02:03 -> open" (without the severity prefix
    when ``severity`` is False)."""
    scope = flag.scope_label
    span = f"{fmt_time(flag.start)} -> {fmt_time(flag.end)}"
    head = f"[{flag.severity.upper()}] {flag.kind}" if severity else flag.kind
    return head + (f" - {scope}" if scope else "") + f" - {span} UTC"


def flag_card_markdown(flag: Flag, advice_label: str = "Advice") -> str:
    """A flag as one block of Markdown: severity badge and title, evidence, advice (one element
    for the browser to draw, where three cost three). Every text of the flag is escaped
    (``dashboards.escape``): evidence quoting a log shows as written, never as an image, a
    link or HTML; only the badge and the bold labels are Markdown."""
    color = {"critical": "red", "warning": "orange"}.get(flag.severity, "blue")
    severity = escape_markdown(flag.severity.upper())
    parts = [f":{color}-badge[{severity}] **{escape_markdown(flag_title(flag, severity=False))}**",
             f"**Evidence:** {escape_markdown(flag.evidence)}" if flag.evidence
             else "_no evidence_"]
    if flag.advice:
        parts.append(f"**{advice_label}:**\n"
                     + "\n".join(f"- {escape_markdown(a)}" for a in flag.advice))
    return "\n\n".join(parts)


def settings() -> Settings:
    """The sidebar selections the app script made on this run (defaults before it has)."""
    window = st.session_state.get("window", "1 h")
    refresh = st.session_state.get("refresh", "5 s")
    window = window if window in WINDOWS else "1 h"
    refresh = refresh if refresh in REFRESHES else "5 s"
    return Settings(WINDOWS[window], REFRESHES[refresh], window, refresh)


def live_panel(settings: Settings, finished_note: bool = True):
    """Decorator: run the page's data panels as a fragment that reruns every refresh interval,
    and end them with the server time that rerun took (what a live refresh costs).

    The page function is called as ``fn(start, end, key)``: the window to show and the source's
    cache key. When the source cannot answer it is not called (``current_window`` renders the
    status); a source failure while it runs stops it with the failure shown under what it drew.
    """

    def deco(fn):
        @st.fragment(run_every=settings.refresh_s)
        def panel() -> None:
            t0 = time.perf_counter()
            win = current_window(settings)
            if win is not None:
                try:
                    ended = load_run_end(key()) if finished_note else None
                    if ended is not None:
                        st.info(finished_text(ended), icon=":material/flag_circle:")
                    fn(win[0], win[1], key())
                except SourceError as exc:
                    source_error(exc)
            st.caption(f"Refreshed in {time.perf_counter() - t0:.3f} s of server time.",
                       help="Time this page's data panels took to query and draw on the server.")

        panel.__name__ = panel.__qualname__ = f"live_{fn.__module__}"
        return panel

    return deco


def source_error(exc: Exception) -> None:
    """Render a source failure that happened mid-page (Prometheus went away, store locked)."""
    show_status(SourceStatus(False, str(exc)))
