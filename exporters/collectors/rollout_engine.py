"""Rollout-engine collector: scrapes the vLLM / SGLang servers behind verl's agent loop.

verl's default rollout (``actor_rollout_ref.rollout.mode: async``) runs inference servers that
serve Prometheus metrics. Every ``--rollout-interval`` seconds (default 5) this collector
fetches each server's ``/metrics``, concurrently and under one overall deadline
(``--rollout-timeout``, default 2 s), keeps the series that decide RL throughput and exports them
as ``verlmon_rollout_*`` labelled ``server`` (``HOST:PORT``), ``engine`` (``vllm``/``sglang``)
and ``model``: KV-cache use, running / waiting / paused requests, preemptions (SGLang:
retractions), generated tokens, queue time and end-to-end latency (sum and count), and the sleep
state where the engine says it. One row per server and scrape goes to the sink (the detectors'
window and the run store's ``rollout_samples``).

Targets: ``--rollout-server URL`` (repeatable), and/or ``--rollout-discovery-file PATH``: the
Prometheus config verl's ``update_prometheus_config`` (verl/workers/rollout/utils.py) writes on
every node when ``actor_rollout_ref.rollout.prometheus.enable=True``; the targets of its
``rollout`` job are read again whenever the file changes.

A server that is down, slow or answers something else is one line of health:
``verlmon_rollout_server_up{server}`` 0 and ``verlmon_rollout_scrape_errors_total{server,
reason}`` (``timeout``, ``connect``, ``http``, ``garbage``), logged in words once per change;
the other servers and the exporter go on.

Cost: the fetches run on a pool of ``MAX_WORKERS`` threads with the standard library's
``http.client``, each server's connection kept alive between rounds, and only the lines of the
wanted series are handed to ``prometheus_client``'s parser (a vLLM answer is ~400 lines; ~15
are kept). httpx's async client cost ~10x the CPU per request here (bench/exporter.py
--rollout; bench/results/rollout_collector_2026-12-01_devbox.txt).
"""

from __future__ import annotations

import http.client
import logging
import math
import os
import socket
import time
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from exporters.registry import ExporterContext, register
from exporters.sampling import ProblemLog, SampledCollector
from monitor import metric_names as m
from monitor.live import FlagGroup
from monitor.urls import UrlError, redact, split_url

log = logging.getLogger("verl_monitor.exporter")

#: Most servers scraped (targets past it are ignored and logged once).
MAX_SERVERS = 1024
#: Threads that fetch at once (each keeps its servers' connections alive between rounds).
MAX_WORKERS = 16
#: Seconds between two looks of a round's watchdog for scrapes past their deadline.
WATCH_S = 0.05
#: Largest /metrics answer read (bytes); a bigger one is cut and counted as garbage.
MAX_BODY_BYTES = 16 << 20
#: The job of verl's written Prometheus config that lists the rollout servers.
VERL_ROLLOUT_JOB = "rollout"
#: Scrape error reasons (``verlmon_rollout_scrape_errors_total``).
REASONS = ("timeout", "connect", "http", "garbage")

#: field -> (how, vLLM's sample, SGLang's sample), each without its ``vllm:`` / ``sglang:``
#: prefix (None: the engine has no such series); how: "max" over engine cores / ranks, or "sum"
_SERIES: dict[str, tuple[str, str | None, str | None]] = {
    "kv_cache_usage": ("max", "kv_cache_usage_perc", "token_usage"),
    "kv_cache_usage_legacy": ("max", "gpu_cache_usage_perc", None),
    "running": ("sum", "num_requests_running", "num_running_reqs"),
    "waiting": ("sum", "num_requests_waiting", "num_queue_reqs"),
    "paused": ("sum", None, "num_paused_reqs"),
    "preemptions_total": ("sum", "num_preemptions_total", "num_retracted_requests_total"),
    "generation_tokens_total": ("sum", "generation_tokens_total", "generation_tokens_total"),
    "queue_time_sum": ("sum", "request_queue_time_seconds_sum", "queue_time_seconds_sum"),
    "queue_time_count": ("sum", "request_queue_time_seconds_count", "queue_time_seconds_count"),
    "e2e_latency_sum": ("sum", "e2e_request_latency_seconds_sum",
                        "e2e_request_latency_seconds_sum"),
    "e2e_latency_count": ("sum", "e2e_request_latency_seconds_count",
                          "e2e_request_latency_seconds_count"),
}
# sample name -> (field, how)
_VLLM = {f"vllm:{v}": (key, how) for key, (how, v, _) in _SERIES.items() if v is not None}
_SGLANG = {f"sglang:{sg}": (key, how) for key, (how, _, sg) in _SERIES.items() if sg is not None}
#: The same series as some SGLang releases, its router and OpenTelemetry relays spell them:
#: ``sglang_num_running_reqs`` for ``sglang:num_running_reqs``.
_SGLANG.update({"sglang_" + name.removeprefix("sglang:"): how for name, how in _SGLANG.items()})
_SLEEP = "vllm:engine_sleep_state"
_WANTED = {**_VLLM, **_SGLANG}
#: The series worth parsing, by exact sample name (``vllm:num_requests_waiting_by_reason`` is
#: not ``vllm:num_requests_waiting``). An answer is mostly the buckets of histograms nobody here
#: reads; comment lines are left out too: every kept sample then parses as an untyped family of
#: its own name, which is all the collector needs.
_NAMES = frozenset({*_WANTED, _SLEEP})


class ScrapeError(Exception):
    """One server's scrape failed; ``reason`` is one of REASONS, the message says what."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass
class EngineReading:
    """What one answer said: the engine, the model and the wanted values (NaN: not exposed)."""

    engine: str
    model: str
    values: dict[str, float] = field(default_factory=dict)
    sleeping: float = math.nan

    def get(self, key: str) -> float:
        """A value, NaN when the engine did not expose it."""
        return self.values.get(key, math.nan)


def server_label(target: str) -> str:
    """``HOST:PORT`` of a target given as a URL or an address (the ``server`` label); user
    information (``user:PASS@``) is never part of it. Raises UrlError for a target without a
    host or with a port that is not a number."""
    text = split_url(target, "--rollout-server").url
    if "://" in text:
        text = text.split("://", 1)[1]
    return text.split("/", 1)[0]


def metrics_url(target: str) -> str:
    """The ``/metrics`` URL of a target: ``HOST:PORT`` or ``http://HOST:PORT[/path]``, without
    its user information (that goes into the ``Authorization`` header: :func:`auth_headers`)."""
    text = split_url(target, "--rollout-server").url
    if "://" not in text:
        text = "http://" + text
    scheme, rest = text.split("://", 1)
    if "/" not in rest:
        return f"{scheme}://{rest}/metrics"
    return text


def auth_headers(target: str) -> dict[str, str]:
    """The basic ``Authorization`` header for a target's ``user:pass@``, else ``{}``."""
    return split_url(target, "--rollout-server").auth_header()


#: Parsed sample lines: most lines of an answer (gauges that did not move, labels) repeat
#: from one scrape to the next, so only new lines go through the parser. Bounded.
_PARSED: dict[str, tuple[str, dict[str, str], float]] = {}
_PARSED_MAX = 50_000


def _parse_lines(lines: list[str]) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of each sample line, with ``prometheus_client``'s parser for the
    lines not seen before; raises ScrapeError (``garbage``) when they do not parse."""
    found = {ln: _PARSED.get(ln) for ln in dict.fromkeys(lines)}
    new = [ln for ln, got in found.items() if got is None]
    if new:
        try:
            samples = [(s.name, s.labels, float(s.value))
                       for fam in text_string_to_metric_families("\n".join(new) + "\n")
                       for s in fam.samples]
        except Exception as exc:  # noqa: BLE001 - the parser's errors vary by version
            raise ScrapeError("garbage", f"the metrics do not parse ({exc})") from None
        if len(samples) != len(new) or any(n not in _NAMES for n, _, _ in samples):
            raise ScrapeError("garbage", "the metrics do not parse (lines and samples differ)")
        if len(_PARSED) + len(new) > _PARSED_MAX:
            _PARSED.clear()
        parsed = dict(zip(new, samples, strict=True))
        _PARSED.update(parsed)
        found.update(parsed)
    return [found[ln] for ln in lines]  # type: ignore[misc]


def parse_exposition(text: str) -> EngineReading:
    """The wanted series of a vLLM or SGLang ``/metrics`` answer; raises ScrapeError
    (``garbage``) when the text holds none of them or does not parse."""
    lines = [ln for ln in text.splitlines()
             if ln.split("{", 1)[0].split(" ", 1)[0] in _NAMES]
    if not lines:
        raise ScrapeError("garbage", "the answer holds no vLLM or SGLang metrics")
    acc: dict[str, float] = {}
    engine = model = ""
    awake: list[float] = []
    for name, labels, value in _parse_lines(lines):
        if name == _SLEEP:
            if labels.get("sleep_state") == "awake":
                awake.append(value)
            continue
        key, how = _WANTED[name]
        if not engine:
            engine = "vllm" if name.startswith("vllm:") else "sglang"
        model = model or labels.get("model_name", "")
        if key in acc:
            acc[key] = max(acc[key], value) if how == "max" else acc[key] + value
        else:
            acc[key] = value
    if not engine:
        raise ScrapeError("garbage", "the answer holds no vLLM or SGLang metrics")
    legacy = acc.pop("kv_cache_usage_legacy", math.nan)
    if "kv_cache_usage" not in acc and not math.isnan(legacy):
        acc["kv_cache_usage"] = legacy  # vLLM before 0.9
    sleeping = math.nan
    if awake:
        sleeping = 1.0 if min(awake) < 0.5 else 0.0  # any engine core asleep
    return EngineReading(engine=engine, model=model or "unknown", values=acc, sleeping=sleeping)


def read_discovery_file(path: str) -> list[str]:
    """The ``rollout`` job's targets in a Prometheus config written by verl
    (``update_prometheus_config``); raises ValueError with the reason in words."""
    import yaml

    with open(path, encoding="utf-8") as fh:
        try:
            doc = yaml.safe_load(fh)
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: not YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a Prometheus config (no mapping at the top)")
    out: list[str] = []
    for job in doc.get("scrape_configs") or []:
        if not isinstance(job, dict) or job.get("job_name") != VERL_ROLLOUT_JOB:
            continue
        for static in job.get("static_configs") or []:
            if isinstance(static, dict):
                out.extend(str(t) for t in static.get("targets") or [] if t)
    return list(dict.fromkeys(out))


@dataclass(eq=False)
class _Server:
    """What the collector keeps per server between scrapes."""

    url: str
    label: str
    up: bool = False
    reading: EngineReading | None = None
    duration: float = math.nan
    errors: dict[str, int] = field(default_factory=dict)
    prev_queue: tuple[float, float] | None = None
    prev_e2e: tuple[float, float] | None = None
    #: a fetch of this server is under way (a slow one may outlive its round)
    busy: bool = False
    conn: http.client.HTTPConnection | None = field(default=None, repr=False)
    #: the basic Authorization header from the target's user information (never shown)
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    #: monotonic time past which this scrape is cut (its socket shut down), and whether it was
    cut_at: float = math.inf
    cut: bool = False
    #: last round's outcome, for the order of the next one: answered, and how fast
    rank: tuple[int, float] = (1, 0.0)
    #: why it is down, logged once (and its coming back)
    problem: ProblemLog = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.problem = ProblemLog(f"rollout server {self.label}", "down ({})", "answers again")

    def drop_connection(self) -> None:
        """Close the kept-alive connection (the next scrape opens a new one)."""
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.close()

    def cut_now(self) -> None:
        """End the scrape under way at once: shut its socket down, so a read that a server
        drips byte by byte (each byte within the socket timeout) returns now."""
        self.cut = True
        conn = self.conn
        sock = conn.sock if conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _timeout(seconds: float) -> ScrapeError:
    return ScrapeError("timeout", f"no answer within {seconds:g} s")


def _get(server: _Server) -> str:
    """GET ``server.url`` on its kept-alive connection (opened when missing); the body as text,
    all of it before ``server.cut_at`` (the round's watchdog shuts the socket down then).
    A kept-alive connection the server has closed meanwhile is retried once on a new one.
    Raises ScrapeError (``http``, ``garbage``), OSError or HTTPException."""
    reused = server.conn is not None
    try:
        return _get_once(server)
    except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
        server.drop_connection()
        if not reused or server.cut:
            raise
        return _get_once(server)


def _left(server: _Server) -> float:
    """Seconds left to the scrape; raises TimeoutError when none (or when it was cut)."""
    left = server.cut_at - time.monotonic()
    if server.cut or left <= 0:
        raise TimeoutError("past the deadline")
    return left


def _get_once(server: _Server) -> str:
    parts = urlsplit(server.url)
    conn = server.conn
    timeout = _left(server)
    if conn is None:
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = cls(parts.hostname or "127.0.0.1", parts.port, timeout=timeout)
        server.conn = conn
    conn.timeout = timeout
    if conn.sock is None:
        conn.connect()
    # the socket exists before the deadline is looked at: a cut after this line finds it
    conn.sock.settimeout(_left(server))
    path = parts.path or "/metrics"
    if parts.query:
        path += "?" + parts.query
    conn.request("GET", path, headers={"Accept": "text/plain", "Accept-Encoding": "identity",
                                       **server.headers})
    resp = conn.getresponse()
    body = resp.read(MAX_BODY_BYTES + 1)
    if server.cut:  # the watchdog shut the socket: what came is a cut piece, not the answer
        raise TimeoutError("past the deadline")
    if len(body) > MAX_BODY_BYTES:
        raise ScrapeError("garbage", f"answer larger than {MAX_BODY_BYTES} bytes")
    if resp.status != 200:
        raise ScrapeError("http", f"HTTP {resp.status}")
    if resp.will_close:
        server.drop_connection()
    return body.decode("utf-8", errors="replace")


def _mean_since(prev: tuple[float, float] | None, total: float, count: float) -> float:
    """Mean of the observations since the previous (sum, count); NaN when none arrived."""
    if prev is None or math.isnan(total) or math.isnan(count):
        return math.nan
    d_count = count - prev[1]
    d_sum = total - prev[0]
    if d_count <= 0 or d_sum < 0:
        return math.nan  # nothing finished, or the engine restarted (counters reset)
    return d_sum / d_count


def add_flags(group: FlagGroup) -> None:
    """The rollout_engine collector's flags: the servers (given or discovered) and the pace."""
    add = group.add_argument
    add("--rollout-server", action="append", default=[], metavar="URL",
        help="a vLLM or SGLang rollout server to scrape (http://HOST:PORT or HOST:PORT; "
        "/metrics is added; USER:PASS@ is sent as basic authentication and shown nowhere, "
        "labels say HOST:PORT); repeat for several")
    add("--rollout-discovery-file", metavar="PATH",
        help="the Prometheus config verl writes with "
        "actor_rollout_ref.rollout.prometheus.enable=True (its prometheus.file, default "
        "/tmp/ray/session_latest/metrics/prometheus/prometheus.yml): scrape the servers of "
        "its 'rollout' job, re-read when it changes")
    add("--rollout-interval", type=float, default=5.0, metavar="SECONDS",
        help="seconds between scrapes of the rollout servers (default 5)")
    add("--rollout-timeout", type=float, default=2.0, metavar="SECONDS",
        help="overall deadline of one scrape of all rollout servers (default 2)")


@register("rollout_engine", default=True, help="vLLM / SGLang rollout servers "
          "(--rollout-server, --rollout-discovery-file): KV cache, requests, preemptions, "
          "tokens, queue time, sleep state", flags=add_flags)
class RolloutEngineCollector(SampledCollector):
    """Scrapes every target each ``--rollout-interval`` on its own thread; see the module
    docstring. Does nothing (and costs nothing) without targets."""

    def __init__(self, ctx: ExporterContext) -> None:
        opts = ctx.options
        interval = max(float(opts.rollout_interval or 5.0), 0.1)
        super().__init__(replace(ctx, interval=interval))
        self.explicit = tuple(opts.rollout_server)
        self.discovery_file = opts.rollout_discovery_file
        self.timeout_s = max(float(opts.rollout_timeout or 2.0), 0.05)
        self.max_servers = MAX_SERVERS
        self.servers: dict[str, _Server] = {}
        self.discovery_error: str | None = None
        self._discovered: list[str] = []
        self._discovery_stamp: tuple[float, int] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._capped_logged = False
        self._bad_targets: set[str] = set()
        self._closed = False

    # ------------------------------------------------------------------ targets

    def targets(self) -> list[str]:
        """Explicit targets, then discovered ones (no duplicates), capped at ``max_servers``.
        A discovered target that is not an address is left out (logged once)."""
        self._refresh_discovery()
        seen: dict[str, str] = {}
        for target in (*self.explicit, *self._discovered):
            try:
                seen.setdefault(server_label(target), target)
            except UrlError as exc:
                if str(exc) not in self._bad_targets:
                    self._bad_targets.add(str(exc))
                    log.warning("rollout engines: %s; left out", exc)
        out = list(seen.values())
        if len(out) > self.max_servers:
            if not self._capped_logged:
                log.warning("rollout engines: %d servers listed, scraping the first %d",
                            len(out), self.max_servers)
                self._capped_logged = True
            out = out[:self.max_servers]
        return out

    def _refresh_discovery(self) -> None:
        path = self.discovery_file
        if not path:
            return
        try:
            st = os.stat(path)
        except FileNotFoundError:
            if self._discovery_stamp is not None or self.discovery_error is None:
                self._set_discovery_error(None)
                self._discovery_stamp = None  # not written yet (verl writes it at startup)
            return
        except OSError as exc:
            self._set_discovery_error(f"--rollout-discovery-file {path}: {exc.strerror}")
            return
        stamp = (st.st_mtime, st.st_size)
        if stamp == self._discovery_stamp:
            return
        self._discovery_stamp = stamp
        try:
            found = read_discovery_file(path)
        except (ValueError, OSError) as exc:
            self._set_discovery_error(f"--rollout-discovery-file {exc}; keeping the "
                                      f"{len(self._discovered)} servers read before")
            return
        self._set_discovery_error(None)
        if found != self._discovered:
            log.info("rollout engines: %d servers in %s", len(found), path)
        self._discovered = found

    def _set_discovery_error(self, message: str | None) -> None:
        if message and message != self.discovery_error:
            log.warning("%s", message)
        self.discovery_error = message

    def healthy(self) -> bool:
        """False when sampling failed or the discovery file cannot be read."""
        return self.last_error is None and self.discovery_error is None

    # ------------------------------------------------------------------ scraping

    def sample(self) -> None:
        """Scrape every target once, concurrently, within the overall deadline."""
        targets = self.targets()
        labels = {server_label(t) for t in targets}
        for gone in [k for k in self.servers if k not in labels]:
            self.servers.pop(gone).cut_now()  # no longer listed: its series go
        if not targets:
            return
        for t in targets:
            label = server_label(t)
            if label not in self.servers:
                self.servers[label] = _Server(url=metrics_url(t), label=label,
                                              headers=auth_headers(t))
        results = self._scrape_all(list(self.servers.values()))
        now = self.ctx.clock()  # the wall clock, or a sped-up simulated run's own
        rows = []
        for server, (outcome, duration) in results.items():
            row = self._account(server, outcome, duration, now)
            if row is not None:
                rows.append(row)
        if rows:
            self.ctx.sink.add_rollout(rows)

    def _scrape_all(self, servers: list[_Server]
                    ) -> dict[_Server, tuple[EngineReading | ScrapeError, float]]:
        """Every server on the pool, all within ``timeout_s``; a server still being read at
        its deadline (or still busy from the previous round) counts as a timeout.

        Servers that answered last round go first, fastest first, so ``MAX_WORKERS`` slow
        ones cannot hold every worker while a healthy one waits; with more servers than
        workers each gets an equal share of the round (``timeout_s`` over the waves needed).
        A watchdog here shuts down the socket of a scrape past its deadline: a server that
        drips its answer (each byte within the socket timeout) is cut there."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=MAX_WORKERS,
                                            thread_name_prefix="rollout-scrape")
        t0 = time.monotonic()
        deadline = t0 + self.timeout_s
        idle = sorted((s for s in servers if not s.busy), key=lambda s: s.rank)
        waves = max(1, math.ceil(len(idle) / MAX_WORKERS))
        share = self.timeout_s / waves
        futures: dict[Future, _Server] = {}
        out: dict[_Server, tuple[EngineReading | ScrapeError, float]] = {
            s: (_timeout(self.timeout_s), self.timeout_s) for s in servers if s.busy}
        for server in idle:
            server.busy, server.cut, server.cut_at = True, False, deadline
            futures[self._pool.submit(self._scrape_one, server, share, deadline)] = server
        pending = set(futures)
        while pending:
            now = time.monotonic()
            if now >= deadline:
                break
            _done, pending = wait(pending, timeout=min(WATCH_S, deadline - now))
            now = time.monotonic()
            for future in pending:
                if futures[future].cut_at <= now:
                    futures[future].cut_now()
        for future, server in futures.items():
            if future in pending:
                server.cut_now()
                out[server] = (_timeout(self.timeout_s), self.timeout_s)
            else:
                out[server] = future.result()
            ok = not isinstance(out[server][0], ScrapeError)
            server.rank = (0 if ok else 1, out[server][1])
        return out

    def _scrape_one(self, server: _Server, share: float, deadline: float
                    ) -> tuple[EngineReading | ScrapeError, float]:
        """One GET of the server's /metrics on a kept-alive connection, within ``share``
        seconds from now and the round's ``deadline``; never raises."""
        t0 = time.monotonic()
        server.cut_at = min(t0 + share, deadline)
        try:
            if self._closed:
                raise TimeoutError("closing")
            text = _get(server)
            return parse_exposition(text), time.monotonic() - t0
        except ScrapeError as exc:
            server.drop_connection()
            return exc, time.monotonic() - t0
        except (TimeoutError, OSError, http.client.HTTPException) as exc:
            server.drop_connection()
            if server.cut or isinstance(exc, TimeoutError) or time.monotonic() >= server.cut_at:
                # past its deadline (the watchdog shut the socket: reads then fail)
                return _timeout(self.timeout_s), time.monotonic() - t0
            # refused, reset, unreachable: connect; not HTTP at all (a bad status line): garbage
            reason = "connect" if isinstance(exc, OSError) else "garbage"
            return ScrapeError(reason, redact(str(exc) or type(exc).__name__)), \
                time.monotonic() - t0
        except Exception as exc:  # noqa: BLE001 - one server's surprise must not stop the rest
            server.drop_connection()
            return ScrapeError("garbage", redact(f"{type(exc).__name__}: {exc}")), \
                time.monotonic() - t0
        finally:
            server.busy = False

    def _account(self, server: _Server, outcome: EngineReading | ScrapeError, duration: float,
                 now: float) -> dict[str, Any] | None:
        server.duration = duration
        if isinstance(outcome, ScrapeError):
            server.errors[outcome.reason] = server.errors.get(outcome.reason, 0) + 1
            server.up = False
            problem = f"{outcome.reason}: {' '.join(str(outcome).split())[:200]}"  # one line
            server.problem.failed(problem)
            return None
        server.problem.recovered()
        server.up = True
        server.reading = outcome
        queue = (outcome.get("queue_time_sum"), outcome.get("queue_time_count"))
        e2e = (outcome.get("e2e_latency_sum"), outcome.get("e2e_latency_count"))
        row = {
            "ts": now,
            "node": self.ctx.node,
            "server": server.label,
            "engine": outcome.engine,
            "model": outcome.model,
            "kv_cache_usage": outcome.get("kv_cache_usage"),
            "running": outcome.get("running"),
            "waiting": outcome.get("waiting"),
            "paused": outcome.get("paused"),
            "preemptions_total": outcome.get("preemptions_total"),
            "generation_tokens_total": outcome.get("generation_tokens_total"),
            "queue_time_mean_s": _mean_since(server.prev_queue, *queue),
            "e2e_latency_mean_s": _mean_since(server.prev_e2e, *e2e),
            "sleeping": outcome.sleeping,
        }
        server.prev_queue, server.prev_e2e = queue, e2e
        return row

    def close(self) -> None:
        """Stop the scrape pool: scrapes under way are cut (their sockets shut down, so no
        worker thread outlives this by more than a moment whatever the servers do), and the
        kept-alive connections closed."""
        self._closed = True
        pool, self._pool = self._pool, None
        for server in list(self.servers.values()):
            server.cut_now()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        for server in list(self.servers.values()):
            if not server.busy:
                server.drop_connection()

    # ------------------------------------------------------------------ exposition

    def collect(self) -> Iterable[Metric]:
        """The ``verlmon_rollout_*`` families from the latest scrape of every server."""
        servers = list(self.servers.values())
        if not servers:
            return
        up = GaugeMetricFamily(m.ROLLOUT_SERVER_UP, "1 when the rollout server's last scrape "
                               "answered with engine metrics.", labels=["server"])
        duration = GaugeMetricFamily(m.ROLLOUT_SCRAPE_DURATION, "Seconds the rollout server's "
                                     "last scrape took.", labels=["server"])
        errors = CounterMetricFamily(m.ROLLOUT_SCRAPE_ERRORS.removesuffix("_total"),
                                     "Failed scrapes of a rollout server: timeout, connect, "
                                     "http (not 200), garbage (no engine metrics).",
                                     labels=["server", "reason"])
        lab = ["server", "engine", "model"]
        kv = GaugeMetricFamily(m.ROLLOUT_KV_CACHE, "KV-cache use of the rollout server, 0..1 "
                               "(highest engine core).", labels=lab)
        reqs = GaugeMetricFamily(m.ROLLOUT_REQUESTS, "Requests running, waiting (queued) and "
                                 "paused (by a weight sync) on the rollout server.",
                                 labels=[*lab, "state"])
        preempt = CounterMetricFamily(m.ROLLOUT_PREEMPTIONS.removesuffix("_total"),
                                      "Requests preempted for lack of KV cache (SGLang: "
                                      "retracted).", labels=lab)
        tokens = CounterMetricFamily(m.ROLLOUT_GEN_TOKENS.removesuffix("_total"),
                                     "Tokens generated by the rollout server.", labels=lab)
        queue = SummaryMetricFamily(m.ROLLOUT_QUEUE_TIME, "Request queue time (the engine's "
                                    "histogram sum and count).", labels=lab)
        e2e = SummaryMetricFamily(m.ROLLOUT_E2E_LATENCY, "End-to-end request latency (the "
                                  "engine's histogram sum and count).", labels=lab)
        sleeping = GaugeMetricFamily(m.ROLLOUT_SLEEPING, "1 while the engine sleeps (weights "
                                     "offloaded for training).", labels=lab)
        for s in sorted(servers, key=lambda s: s.label):
            up.add_metric([s.label], 1.0 if s.up else 0.0)
            if not math.isnan(s.duration):
                duration.add_metric([s.label], s.duration)
            for reason in REASONS:
                errors.add_metric([s.label, reason], s.errors.get(reason, 0))
            r = s.reading
            if not s.up or r is None:
                continue
            values = [s.label, r.engine, r.model]
            _add(kv, values, r.get("kv_cache_usage"))
            for state in ("running", "waiting", "paused"):
                _add(reqs, [*values, state], r.get(state))
            _add(preempt, values, r.get("preemptions_total"))
            _add(tokens, values, r.get("generation_tokens_total"))
            for fam, key in ((queue, "queue_time"), (e2e, "e2e_latency")):
                total, count = r.get(f"{key}_sum"), r.get(f"{key}_count")
                if not (math.isnan(total) or math.isnan(count)):
                    fam.add_metric(values, count_value=count, sum_value=total)
            _add(sleeping, values, r.sleeping)
        for fam in (up, duration, errors, kv, reqs, preempt, tokens, queue, e2e, sleeping):
            if fam.samples:
                yield fam


def _add(fam: Metric, values: list[str], value: float) -> None:
    if not math.isnan(value):
        fam.add_metric(values, value)
