"""The exporter's web server: ``/metrics`` (gzip when asked), ``/`` (landing page), 404
elsewhere; over HTTPS and with basic auth when the web config (exporters/webconfig.py) says so.

Given a ``scrape`` callable (the exporter's ``Exposition.render``), ``/metrics`` answers in
OpenMetrics when the Accept header asks for it (text format 0.0.4 otherwise) and keeps only the
families named by ``name[]`` in the URL (``/metrics?name[]=verlmon_gpu_up``), as
prometheus_client's own server does.

The server thread sleeps until a client connects (no periodic polling); each request is served
on its own thread. TLS handshakes run in the request's thread, under a timeout, so a silent
client blocks nobody.

Like the Prometheus exporter toolkit: a listen backlog of ``BACKLOG`` (a burst of scrapers
is queued by the kernel, not refused or retried a second later), ``TCP_NODELAY`` and each
response in one write (a keep-alive scrape never waits on Nagle and the delayed ACK), request
line and headers capped before authentication (``MAX_HEADER_BYTES`` in all, and http.client's
100 header lines; past either the answer is 431 and the connection closes), and the web
config's extra headers on every response. Basic auth's cost limits live in
exporters/webconfig.py.

At scale and under attack (issue 20): at most ``max_connections`` connections at once (default
``DEFAULT_MAX_CONNECTIONS``, well below the file-descriptor limit); a new connection past the
cap takes the place of the connection that has waited longest without a complete request (an
idle keep-alive, a silent socket, a drip-feed), and is closed at once when every connection is
busy being answered. A request must arrive whole within ``REQUEST_DEADLINE_S`` of its first
byte (of the accept, for a connection's first request): the deadline covers every read, so a
client dripping a byte a second is cut off. A keep-alive connection may idle
``KEEPALIVE_IDLE_S`` between requests. A request body (a GET with ``Content-Length``) is read
and thrown away up to ``MAX_BODY_BYTES`` (413 and close past it), ``Transfer-Encoding`` is
refused (400 and close), as are two ``Content-Length`` or two ``Authorization`` headers: a body
never becomes a second request. ``q=0`` in Accept-Encoding means no gzip. Every connection
closed and request refused is counted (:meth:`MetricsServer.collect`).
"""

from __future__ import annotations

import gzip
import http.client
import io
import logging
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from exporters.exposition import CONTENT_TYPE, negotiate, qvalues
from exporters.options import DEFAULT_MAX_CONNECTIONS  # each holds a thread and a descriptor
from exporters.webconfig import LoginsBusy, WebConfig
from monitor import metric_names as m

log = logging.getLogger("verl_monitor.exporter")

#: Pending connections the kernel queues (Linux caps it at net.core.somaxconn).
BACKLOG = 1024
#: Bytes of request line and headers one request may send before it is answered 431.
MAX_HEADER_BYTES = 64 * 1024
#: Seconds a whole request (line, headers, body) may take from its first byte.
REQUEST_DEADLINE_S = 10.0
#: Seconds a keep-alive connection may wait for its next request.
KEEPALIVE_IDLE_S = 120.0
#: Bytes of request body read and thrown away (a GET with a body); past it 413 and close.
MAX_BODY_BYTES = 64 * 1024
#: Seconds the accept loop waits for evicted connections to close before refusing a new one.
EVICT_WAIT_S = 0.5
#: Why a connection was closed early (``verlmon_http_connections_closed_total{reason}``).
CLOSE_REASONS = ("over_cap", "evicted", "deadline")
#: Why a request was refused (``verlmon_http_requests_refused_total{reason}``).
REFUSE_REASONS = ("bad_framing", "duplicate_header", "body_too_large", "logins_busy")


class _DeadlineIO(io.RawIOBase):
    """The socket's reads under one deadline for the whole request (``deadline``, a
    ``time.monotonic()`` value): each read waits only for the time left, so a client sending
    a byte a second is cut off at the deadline, not kept alive by every byte."""

    def __init__(self, sock: socket.socket) -> None:
        super().__init__()
        self._sock = sock
        self.deadline = time.monotonic() + REQUEST_DEADLINE_S
        self.expired = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            self.expired = True
            raise TimeoutError("request deadline passed")
        self._sock.settimeout(left)
        try:
            return self._sock.recv_into(buffer)
        except TimeoutError:
            self.expired = True
            raise
        except ConnectionError:
            return 0  # reset by the client, or shut down to make room: end of stream


class _Connections:
    """The open connections: admits up to ``cap``, evicting the one that has waited longest
    for a complete request when full; counts what it closes."""

    def __init__(self, cap: int) -> None:
        self.cap = max(1, int(cap))
        self._lock = threading.Condition()
        #: socket -> [evictable since (monotonic) or None while answering, evicted?]
        self._open: dict[Any, list] = {}
        self.closed = dict.fromkeys(CLOSE_REASONS, 0)

    def __len__(self) -> int:
        return len(self._open)

    def admit(self, sock) -> bool:
        """Register a new connection; False (counted) when it must be closed at once."""
        with self._lock:
            # evicted connections whose threads have not closed them yet still hold a
            # descriptor: at most cap of them, waited for (briefly) before more are made
            self._lock.wait_for(lambda: len(self._open) < 2 * self.cap, timeout=EVICT_WAIT_S)
            live = [(state[0], s) for s, state in self._open.items() if not state[1]]
            if len(live) >= self.cap:
                waiting = [(since, s) for since, s in live if since is not None]
                if not waiting or len(self._open) >= 2 * self.cap:
                    self.closed["over_cap"] += 1
                    return False
                victim = min(waiting, key=lambda pair: pair[0])[1]
                self._open[victim][1] = True
                self.closed["evicted"] += 1
                try:  # wakes its thread's read with end-of-stream; the thread closes it
                    socket.socket.shutdown(victim, socket.SHUT_RDWR)
                except OSError:
                    pass
            self._open[sock] = [time.monotonic(), False]
            return True

    def waiting(self, sock) -> None:
        """The connection waits for (the rest of) a request: it may be evicted."""
        with self._lock:
            state = self._open.get(sock)
            if state is not None and state[0] is None:
                state[0] = time.monotonic()

    def answering(self, sock) -> None:
        """The connection's request is complete and being answered: it is not evicted."""
        with self._lock:
            state = self._open.get(sock)
            if state is not None:
                state[0] = None

    def release(self, sock) -> None:
        """The connection is closed."""
        with self._lock:
            self._open.pop(sock, None)
            self._lock.notify_all()

    def count(self, reason: str) -> None:
        """Count one connection closed for ``reason``."""
        with self._lock:
            self.closed[reason] += 1


class _CappedReader:
    """The request stream with a byte budget for the request line and headers: a client
    cannot make the server hold more than ``MAX_HEADER_BYTES`` before it is authenticated."""

    def __init__(self, raw) -> None:
        self._raw = raw
        self.budget = MAX_HEADER_BYTES

    def readline(self, limit: int = -1) -> bytes:
        if self.budget <= 0:
            raise http.client.LineTooLong("header")
        cap = self.budget + 1 if limit is None or limit < 0 else min(limit, self.budget + 1)
        line = self._raw.readline(cap)
        self.budget -= len(line)
        if self.budget < 0:
            raise http.client.LineTooLong("header")
        return line

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = REQUEST_DEADLINE_S  # the TLS handshake's limit (reads have their own deadline)

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet: no access log
        return

    def setup(self) -> None:
        super().setup()  # sets the socket timeout
        try:  # answers leave at once: no Nagle wait for the client's delayed ACK
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        self._reads = _DeadlineIO(self.request)
        self._requests = 0
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()  # here, in the request's thread, under the timeout
        self.rfile.close()  # the socket's own buffered file: reads go through the deadline
        self._buffered = io.BufferedReader(self._reads)
        self.rfile = _CappedReader(self._buffered)

    def handle(self) -> None:
        try:
            super().handle()
        finally:
            if self._reads.expired:
                self.server.connections.count("deadline")

    def handle_one_request(self) -> None:
        connections = self.server.connections
        connections.waiting(self.request)
        if self._requests:
            # keep-alive: wait for the next request's first byte (at once when pipelined),
            # then that request's deadline starts
            self._reads.deadline = time.monotonic() + KEEPALIVE_IDLE_S
            try:
                first = self._buffered.peek(1)
            except TimeoutError:
                first = b""
                self._reads.expired = False  # an idle keep-alive running out is no attack
            if not first:
                self.close_connection = True
                return
            self._reads.deadline = time.monotonic() + REQUEST_DEADLINE_S
        self._requests += 1
        self.rfile.budget = MAX_HEADER_BYTES  # a fresh budget for each keep-alive request
        try:
            super().handle_one_request()  # headers over the budget: 431 from parse_request
        except http.client.LineTooLong:  # the request line alone used the budget up
            self.close_connection = True
            self.command, self.requestline, self.request_version = "", "", "HTTP/1.1"
            self.send_error(431, "Request header fields too large")

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if ok:
            self.server.connections.answering(self.request)
        return ok

    def end_headers(self) -> None:
        for key, value in self.server.web.headers.items():
            self.send_header(key, value)
        super().end_headers()

    def _send(self, code: int, body: bytes, ctype: str, headers: dict | None = None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        for key, value in self.server.web.headers.items():
            self.send_header(key, value)
        # headers and body in one write (one TCP segment train, one TLS record)
        self._headers_buffer.append(b"\r\n")
        if self.command != "HEAD":
            self._headers_buffer.append(body)
        self.request.settimeout(REQUEST_DEADLINE_S)  # sendall's limit is for the whole answer
        self.flush_headers()

    def _refuse(self, code: int, reason: str, text: str, headers: dict | None = None) -> None:
        """Answer ``code`` with one line of text, close the connection, count ``reason``."""
        self.server.refused[reason] += 1
        self._send(code, f"{text}\n".encode(), "text/plain; charset=utf-8",
                   {**(headers or {}), "Connection": "close"})

    def _framing_ok(self) -> bool:
        """The request's body read and thrown away, or the request refused (False): a body,
        a second Content-Length or a chunked body never becomes a request of its own."""
        headers = self.headers
        if len(headers.get_all("Authorization") or []) > 1:
            self._refuse(400, "duplicate_header", "Bad request: more than one Authorization "
                         "header")
            return False
        if headers.get_all("Transfer-Encoding"):
            self._refuse(400, "bad_framing", "Bad request: Transfer-Encoding is not accepted "
                         "(send no body)")
            return False
        lengths = headers.get_all("Content-Length") or []
        if len(lengths) > 1 or (lengths and not lengths[0].strip().isdigit()):
            self._refuse(400, "bad_framing", "Bad request: one Content-Length, a number")
            return False
        size = int(lengths[0]) if lengths else 0
        if size > MAX_BODY_BYTES:
            self._refuse(413, "body_too_large", "Request body too large (send no body)")
            return False
        while size > 0:  # thrown away, under the request's deadline
            chunk = self.rfile.read(min(size, 65536))
            if not chunk:
                self.close_connection = True
                return False
            size -= len(chunk)
        return True

    def _authorized(self) -> bool:
        web = self.server.web
        if not web.auth_required:
            return True
        try:
            if web.check_authorization(self.headers.get("Authorization")):
                return True
        except LoginsBusy:
            self._refuse(429, "logins_busy", "Too many logins being checked; retry shortly",
                         {"Retry-After": "1"})
            return False
        self._send(401, b"Unauthorized\n", "text/plain; charset=utf-8",
                   {"WWW-Authenticate": 'Basic realm="verl-monitor"'})
        return False

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
        if not self._framing_ok():
            return
        path = self.path.split("?", 1)[0]
        if path not in ("/", "/metrics"):
            self._send(404, b"Not found: try /metrics\n", "text/plain; charset=utf-8")
            return
        if not self._authorized():
            return
        if path == "/":
            self._send(200, self.server.landing(), "text/html; charset=utf-8")
            return
        ctype = CONTENT_TYPE
        try:
            if self.server.scrape is None:
                body = self.server.render()
            else:
                openmetrics, ctype = negotiate(self.headers.get("Accept"))
                query = parse_qs(self.path.split("?", 1)[1]) if "?" in self.path else {}
                names = frozenset(query["name[]"]) if "name[]" in query else None
                body = self.server.scrape(names, openmetrics)
        except Exception as exc:  # noqa: BLE001 - answer 500 in words, keep serving
            log.error("scrape failed: %s: %s", exc.__class__.__name__, exc)
            self._send(500, b"scrape failed; see the exporter's log\n",
                       "text/plain; charset=utf-8")
            return
        headers = {}
        if _accepts_gzip(self.headers.get("Accept-Encoding")):
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        self._send(200, body, ctype, headers)

    do_HEAD = do_GET  # noqa: N815


def _accepts_gzip(header: str | None) -> bool:
    """True when Accept-Encoding allows gzip: named (or ``*``) with a q-value above 0."""
    weights = qvalues(header)
    for name in ("gzip", "x-gzip", "*"):
        if name in weights:
            return weights[name] > 0
    return False


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = BACKLOG  # listen() backlog (socketserver's default is 5)

    def __init__(self, address, render, landing, web: WebConfig, scrape=None,
                 max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        host = address[0]
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__(address, _Handler)
        self.render = render
        self.scrape = scrape
        self.landing = landing
        self.web = web
        self.connections = _Connections(max_connections)
        self.refused = dict.fromkeys(REFUSE_REASONS, 0)
        if web.ssl_context is not None:
            # the handshake runs in the request thread, so a silent client blocks nobody else
            self.socket = web.ssl_context.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )

    def handle_error(self, request, client_address) -> None:
        # TLS handshake failures, resets, plain HTTP sent to the HTTPS port: not our problem
        return

    def verify_request(self, request, client_address) -> bool:
        return self.connections.admit(request)  # False: closed at once (over the cap)

    def process_request(self, request, client_address) -> None:
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread: the connection is closed by the caller
            self.connections.release(request)
            raise

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.release(request)


def parse_listen_address(value: str) -> tuple[str, int]:
    """``HOST:PORT``, ``:PORT`` or ``[v6]:PORT`` to (host, port); ValueError in words."""
    text = value.strip()
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"listen address {value!r} is not HOST:PORT (e.g. 0.0.0.0:9048)")
    host = host.strip("[]") or "0.0.0.0"
    num = int(port)
    if not 0 <= num <= 65535:
        raise ValueError(f"listen address {value!r}: port must be 0..65535")
    return host, num


def raise_open_files_limit(want: int = 65536) -> int:
    """Raise this process's soft open-files limit towards ``want`` (never above the hard
    limit, as Go programs do at start); the soft limit now in force."""
    try:
        import resource
    except ImportError:  # not on POSIX
        return want
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def connection_cap(wanted: int) -> int:
    """``wanted`` connections, lowered to a third of the open-files limit (evicted connections
    closing hold as many again; the rest is for the store, logs and dumps), at least 1;
    lowering is logged."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except ImportError:
        soft = -1
    cap = max(1, int(wanted))
    if soft != -1 and soft > 0 and cap > soft // 3:
        lowered = max(1, soft // 3)
        log.warning("serving at most %d connections, not %d: the open-files limit is %d "
                    "(raise LimitNOFILE / ulimit -n)", lowered, cap, soft)
        cap = lowered
    return cap


class MetricsServer:
    """Serves /metrics and / on a background thread; ``port`` is the bound port (0 resolved).

    ``render()`` gives the /metrics text (format 0.0.4); with ``scrape(names, openmetrics)``
    instead, each scrape's Accept header and ``name[]`` filter are passed on.
    """

    def __init__(
        self,
        address: tuple[str, int],
        render: Callable[[], bytes],
        landing: Callable[[], bytes],
        web: WebConfig | None = None,
        scrape: Callable[[frozenset[str] | None, bool], bytes] | None = None,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        self.web = web or WebConfig()
        #: connections served at once: as asked, but at most a third of the open-files limit
        self.max_connections = connection_cap(max_connections)
        self._server = _Server(address, render, landing, self.web, scrape,
                               self.max_connections)
        self._server.timeout = 0.5  # handle_request() never blocks longer than this
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread: threading.Thread | None = None
        #: exceptions in the accept loop (each logged once per reason; the loop carries on)
        self.restarts = 0

    @property
    def host(self) -> str:
        """The bound host."""
        return self._server.server_address[0]

    @property
    def port(self) -> int:
        """The bound port (the real one when 0 was asked)."""
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        """The /metrics URL a person can open (0.0.0.0 shown as the host name)."""
        host = self.host
        if host in ("0.0.0.0", "::"):
            host = socket.gethostname()
        elif ":" in host:
            host = f"[{host}]"
        scheme = "https" if self.web.tls else "http"
        return f"{scheme}://{host}:{self.port}/metrics"

    def start(self) -> None:
        """Start serving in a daemon thread."""
        self._thread = threading.Thread(target=self._serve, name="metrics-server", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        # Sleeps until a client connects or stop() writes to the wake socket: no periodic
        # polling (serve_forever wakes every poll_interval, which costs CPU on an idle node).
        with selectors.DefaultSelector() as sel:
            sel.register(self._server.socket, selectors.EVENT_READ, "accept")
            sel.register(self._wake_r, selectors.EVENT_READ, "stop")
            logged: set[str] = set()
            while True:
                try:
                    for key, _ in sel.select():
                        if key.data == "stop":
                            return
                        self._server.handle_request()  # accepts, then a thread serves it
                except Exception as exc:  # noqa: BLE001 - the server must not die
                    self.restarts += 1
                    reason = f"{exc.__class__.__name__}: {exc}"
                    if reason not in logged:
                        logged.add(reason)
                        log.error("metrics server: %s; serving on", reason)
                    time.sleep(0.1)  # e.g. out of file descriptors: do not spin

    def collect(self) -> list[Metric]:
        """Open connections, connections closed early and requests refused, by reason (the
        server reports on itself: the exporter registers it with the live monitor's health)."""
        conns = self._server.connections
        open_now = GaugeMetricFamily(m.HTTP_CONNECTIONS, "HTTP connections open now (at most "
                                     f"{self.max_connections}, --web.max-connections).",
                                     value=len(conns))
        closed = CounterMetricFamily(
            m.HTTP_CONNECTIONS_CLOSED.removesuffix("_total"),
            "HTTP connections closed early: over_cap (every connection busy), evicted (made "
            "room: had waited longest for a request), deadline (request not whole in time).",
            labels=["reason"])
        for reason, count in conns.closed.items():
            closed.add_metric([reason], count)
        refused = CounterMetricFamily(
            m.HTTP_REQUESTS_REFUSED.removesuffix("_total"),
            "HTTP requests refused: bad_framing (Transfer-Encoding, bad Content-Length), "
            "duplicate_header (two Authorization), body_too_large, logins_busy (429: too many "
            "logins waiting for bcrypt).", labels=["reason"])
        for reason, count in self._server.refused.items():
            refused.add_metric([reason], count)
        return [open_now, closed, refused]

    def stop(self) -> None:
        """Stop serving and close the sockets."""
        self._wake_w.send(b"x")
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._server.server_close()
        self._wake_r.close()
        self._wake_w.close()


