"""The driver's phase timeline on every node, and per-phase GPU activity counters.

verl's log is written on the driver's node only. Its exporter already serves the last step's
number, end time, total and phase seconds on /metrics (``verlmon_training_step``,
``verlmon_last_step_timestamp_seconds``, ``verlmon_step_duration_seconds``,
``verlmon_phase_duration_seconds{phase}``). Another node's exporter, given the driver's
/metrics URL (``--phase-source``), reads them after each step, rebuilds the step with the
same layout the driver uses (:func:`monitor.analysis.attribution.phase_timeline`) and labels
its own GPU samples of that step with phases. The driver's exporter does the same from the
steps of its own log. Both add the result to counters, so Prometheus sees every step whatever
its scrape interval:

- ``verlmon_phase_gpu_seconds_total{phase,gpu}``: seconds of the phase (as the log gives them)
  in steps where this GPU had at least one sample inside it;
- ``verlmon_phase_gpu_sm_active_seconds_total{phase,gpu}``: those seconds times the GPU's mean
  SM activity in the phase (0..1); ``..._utilization_seconds_total`` the same for NVML
  utilization. ``rate(sm_active) / rate(seconds)`` is the phase's mean SM activity;
- ``verlmon_phase_gpu_samples_total{phase,gpu}``: samples that fell in the phase. A phase
  shorter than the sampling interval gets 0 or 1 sample a step: few samples, low confidence.

Clocks of the nodes must agree (NTP) to within a fraction of the shortest phase that matters.
"""

from __future__ import annotations

import http.client
import math
import socket
import threading
import time
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from monitor import metric_names as m
from monitor.records import StepRecord
from monitor.urls import redact, split_url

#: Seconds a fetch of the driver's /metrics may take.
FETCH_TIMEOUT_S = 3.0
#: Seconds between two looks for the driver among several addresses (a headless Service).
RESCAN_S = 30.0
#: Addresses read at once when looking for the driver.
SCAN_WORKERS = 32


class PhaseSourceError(RuntimeError):
    """The driver's /metrics cannot be read or lacks the last step; one line saying why."""


def step_from_metrics(text: str) -> StepRecord | None:
    """The driver's last step from its /metrics text, or None when it has not seen a step.

    Raises PhaseSourceError for text that is not a Prometheus exposition."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    phases: dict[str, float] = {}
    try:
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if s.name == m.PHASE_DURATION and "phase" in s.labels:
                    phases[s.labels["phase"]] = float(s.value)
                elif s.name in (m.TRAIN_STEP, m.LAST_STEP_TS, m.STEP_DURATION):
                    values[s.name] = float(s.value)
    except ValueError as exc:
        raise PhaseSourceError(f"not Prometheus metrics: {exc}") from None
    if m.TRAIN_STEP not in values or m.LAST_STEP_TS not in values or not phases:
        return None
    total = values.get(m.STEP_DURATION)
    return StepRecord(step=int(values[m.TRAIN_STEP]), end_time=values[m.LAST_STEP_TS],
                      total=total, phases=phases, time_source="line")


#: Largest /metrics answer of the driver read, bytes (a driver's is ~50 KB).
MAX_ANSWER_BYTES = 8 << 20


def read_url(url: str, timeout: float = FETCH_TIMEOUT_S,
             headers: dict[str, str] | None = None) -> str:
    """GET ``url`` (no user information in it: credentials come in ``headers``) and return the
    body as text, all of it within ``timeout`` seconds: connect, headers and every byte. At the
    deadline a timer shuts the socket down, so a server that drips its answer (each byte
    within any per-read timeout) cannot hold the read. Raises PhaseSourceError in words."""
    parts = urllib.parse.urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
    late = threading.Event()

    def cut() -> None:
        late.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    timer = threading.Timer(timeout, cut)
    timer.daemon = True
    timer.start()
    shown = redact(url)
    try:
        conn.connect()
        if late.is_set():  # connected after the timer fired: it found no socket to cut
            raise TimeoutError
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        conn.request("GET", path, headers={"Accept": "text/plain", **(headers or {})})
        resp = conn.getresponse()
        body = resp.read(MAX_ANSWER_BYTES + 1)
        if late.is_set():
            raise TimeoutError
        if resp.status != 200:
            raise PhaseSourceError(f"cannot read {shown}: HTTP {resp.status}")
        if len(body) > MAX_ANSWER_BYTES:
            raise PhaseSourceError(f"cannot read {shown}: an answer over "
                                   f"{MAX_ANSWER_BYTES >> 20} MiB")
        return body.decode("utf-8", errors="replace")
    except (TimeoutError, OSError, http.client.HTTPException) as exc:
        if late.is_set() or isinstance(exc, TimeoutError):
            raise PhaseSourceError(f"cannot read {shown}: no whole answer within "
                                   f"{timeout:g} s") from None
        why = redact(str(exc) or type(exc).__name__)
        raise PhaseSourceError(f"cannot read {shown}: {why}") from None
    finally:
        timer.cancel()
        conn.close()


def fetch_step(url: str, timeout: float = FETCH_TIMEOUT_S,
               headers: dict[str, str] | None = None) -> StepRecord | None:
    """GET the driver's /metrics and return its last step (None before the first step)."""
    return step_from_metrics(read_url(url, timeout, headers))


def _resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (one per exporter behind a headless Service)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class PhaseSource:
    """The driver's /metrics behind ``--phase-source``, whose host may name several exporters.

    A host with one address is read as given. A host with several (a Kubernetes headless
    Service over the DaemonSet's exporters: one address per node) is every node's exporter;
    the driver is the one whose /metrics has steps (it follows the log). It is remembered and
    looked for again, at most every ``rescan_s`` seconds, when it stops answering with a step.
    ``resolve(host, port)`` lists the addresses (DNS by default).
    """

    def __init__(self, url: str, rescan_s: float = RESCAN_S,
                 resolve=_resolve, timeout: float = FETCH_TIMEOUT_S) -> None:
        split = split_url(url, "--phase-source")
        #: the URL without its user information (shown, logged); that goes in ``_headers``
        self.url = split.url
        self._headers = split.auth_header()
        self.rescan_s = rescan_s
        self.timeout = timeout
        self._resolve = resolve
        self.driver: str | None = None
        self._next_scan = 0.0

    def candidates(self) -> list[str]:
        """The URL once per address its host resolves to (the URL itself for one address)."""
        parts = urllib.parse.urlsplit(self.url)
        host = parts.hostname or ""
        try:
            addrs = self._resolve(host, parts.port or 80)
        except OSError as exc:
            raise PhaseSourceError(f"cannot resolve {host}: {exc}") from None
        if len(addrs) <= 1:
            return [self.url]
        out = []
        for addr in addrs:
            name = f"[{addr}]" if ":" in addr else addr
            port = f":{parts.port}" if parts.port else ""
            out.append(urllib.parse.urlunsplit(parts._replace(netloc=f"{name}{port}")))
        return out

    def fetch(self) -> StepRecord | None:
        """The driver's last step (None before the first step or while no address has one)."""
        if self.driver is not None:
            try:
                rec = fetch_step(self.driver, self.timeout, self._headers)
                if rec is not None:
                    return rec
            except PhaseSourceError:
                pass
            self.driver = None
        urls = self.candidates()
        if len(urls) == 1:
            rec = fetch_step(urls[0], self.timeout, self._headers)
            self.driver = urls[0] if rec is not None else None
            return rec
        now = time.monotonic()
        if now < self._next_scan:
            return None
        self._next_scan = now + self.rescan_s
        best: tuple[str, StepRecord] | None = None
        errors: list[str] = []
        for url, rec in self._read_all(urls):
            if isinstance(rec, PhaseSourceError):
                errors.append(str(rec))
                continue
            if rec is not None and (best is None or (rec.end_time or 0) > (best[1].end_time or 0)):
                best = (url, rec)
        if best is None:
            if len(errors) == len(urls):
                raise PhaseSourceError(errors[0])
            return None
        self.driver = best[0]
        return best[1]


    def _read_all(self, urls: list[str]) -> list[tuple[str, StepRecord | None | Exception]]:
        """Every address read at once (``SCAN_WORKERS`` at a time), each within the timeout:
        slow or dripping exporters cost the scan one timeout, not one each."""
        from concurrent.futures import ThreadPoolExecutor

        def read(url: str) -> StepRecord | None | Exception:
            try:
                return fetch_step(url, self.timeout, self._headers)
            except PhaseSourceError as exc:
                return exc

        with ThreadPoolExecutor(max_workers=min(SCAN_WORKERS, len(urls)),
                                thread_name_prefix="phase-source") as pool:
            return list(zip(urls, pool.map(read, urls), strict=True))


@dataclass
class PhaseGpuTotals:
    """Per (phase, gpu) running totals; :meth:`add_step` adds one step, thread-safe."""

    seconds: dict[tuple[str, str], float] = field(default_factory=dict)
    sm_seconds: dict[tuple[str, str], float] = field(default_factory=dict)
    util_seconds: dict[tuple[str, str], float] = field(default_factory=dict)
    samples: dict[tuple[str, str], int] = field(default_factory=dict)
    steps: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add_step(self, rec: StepRecord, gpu: pd.DataFrame) -> int:
        """Attribute this node's GPU samples (``ts``, ``gpu``, ``sm_active``/``util`` in %)
        of step ``rec`` to its phases; returns how many samples fell inside a phase."""
        from monitor.analysis.attribution import label_samples, phase_timeline

        timeline = phase_timeline([rec])
        if len(timeline) == 0 or len(gpu) == 0:
            return 0
        lo, hi = float(timeline["start"].min()), float(timeline["end"].max())
        ts = gpu["ts"].to_numpy(float)
        sub = gpu[(ts >= lo) & (ts < hi)]
        if len(sub) == 0:
            return 0
        lab = label_samples(sub[["ts", "gpu", "sm_active", "util"]], timeline)
        lab = lab[lab["phase"].notna()]
        dur = (timeline["end"] - timeline["start"]).groupby(timeline["phase"]).sum()
        add: list[tuple[tuple[str, str], float, float | None, float | None, int]] = []
        for (phase, g), grp in lab.groupby(["phase", "gpu"], sort=True):
            seconds = float(dur.get(phase, 0.0))
            if seconds <= 0:
                continue
            sm = _mean_ratio(grp["sm_active"])
            util = _mean_ratio(grp["util"])
            add.append(((str(phase), str(int(g))), seconds, sm, util, len(grp)))
        with self._lock:
            for key, seconds, sm, util, n in add:
                self.seconds[key] = self.seconds.get(key, 0.0) + seconds
                self.samples[key] = self.samples.get(key, 0) + n
                if sm is not None:
                    self.sm_seconds[key] = self.sm_seconds.get(key, 0.0) + sm * seconds
                if util is not None:
                    self.util_seconds[key] = self.util_seconds.get(key, 0.0) + util * seconds
            self.steps += 1
        return sum(a[4] for a in add)

    def snapshot(self) -> tuple[dict, dict, dict, dict]:
        """Copies of (seconds, sm_seconds, util_seconds, samples)."""
        with self._lock:
            return (dict(self.seconds), dict(self.sm_seconds), dict(self.util_seconds),
                    dict(self.samples))


def _mean_ratio(values: pd.Series) -> float | None:
    arr = values.to_numpy(float)
    arr = arr[np.isfinite(arr)]
    if len(arr) == 0:
        return None
    mean = float(arr.mean()) / 100.0
    return min(max(mean, 0.0), 1.0) if math.isfinite(mean) else None


def families(totals: PhaseGpuTotals) -> Iterable:
    """The four counter families from ``totals`` (nothing before the first step)."""
    from prometheus_client.core import CounterMetricFamily

    seconds, sm, util, samples = totals.snapshot()
    if not seconds:
        return
    spec = (
        (m.PHASE_GPU_SECONDS, "Seconds of each phase (the driver's timeline) in steps where "
         "this GPU had a sample inside it.", seconds),
        (m.PHASE_GPU_SM_ACTIVE_SECONDS, "Phase seconds times the GPU's mean SM activity "
         "(0..1) in the phase; over phase_gpu_seconds: the phase's mean SM activity.", sm),
        (m.PHASE_GPU_UTIL_SECONDS, "Phase seconds times the GPU's mean NVML utilization "
         "(0..1) in the phase.", util),
        (m.PHASE_GPU_SAMPLES, "GPU samples that fell inside each phase (few per step: the "
         "phase is shorter than the sampling interval).", samples),
    )
    for name, help_text, data in spec:
        fam = CounterMetricFamily(name.removesuffix("_total"), help_text,
                                  labels=["phase", "gpu"])
        for (phase, gpu), value in sorted(data.items()):
            fam.add_metric([phase, gpu], float(value))
        yield fam
