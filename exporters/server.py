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
"""

from __future__ import annotations

import gzip
import http.client
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

from exporters.exposition import CONTENT_TYPE, negotiate
from exporters.webconfig import WebConfig

log = logging.getLogger("verl_monitor.exporter")

#: Pending connections the kernel queues (Linux caps it at net.core.somaxconn).
BACKLOG = 1024
#: Bytes of request line and headers one request may send before it is answered 431.
MAX_HEADER_BYTES = 64 * 1024


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
    timeout = 30  # seconds a client may take to send its request (also the TLS handshake)

    def log_message(self, fmt: str, *args: Any) -> None:  # quiet: no access log
        return

    def setup(self) -> None:
        super().setup()  # sets the socket timeout
        try:  # answers leave at once: no Nagle wait for the client's delayed ACK
            self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        if isinstance(self.request, ssl.SSLSocket):
            self.request.do_handshake()  # here, in the request's thread, under the timeout
        self.rfile = _CappedReader(self.rfile)

    def handle_one_request(self) -> None:
        self.rfile.budget = MAX_HEADER_BYTES  # a fresh budget for each keep-alive request
        try:
            super().handle_one_request()  # headers over the budget: 431 from parse_request
        except http.client.LineTooLong:  # the request line alone used the budget up
            self.close_connection = True
            self.command, self.requestline, self.request_version = "", "", "HTTP/1.1"
            self.send_error(431, "Request header fields too large")

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
        self.flush_headers()

    def _authorized(self) -> bool:
        web = self.server.web
        if not web.auth_required:
            return True
        if web.check_authorization(self.headers.get("Authorization")):
            return True
        self._send(401, b"Unauthorized\n", "text/plain; charset=utf-8",
                   {"WWW-Authenticate": 'Basic realm="verl-monitor"'})
        return False

    def do_GET(self) -> None:  # noqa: N802 - http.server naming
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
        if "gzip" in (self.headers.get("Accept-Encoding") or ""):
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        self._send(200, body, ctype, headers)

    do_HEAD = do_GET  # noqa: N815


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = BACKLOG  # listen() backlog (socketserver's default is 5)

    def __init__(self, address, render, landing, web: WebConfig, scrape=None) -> None:
        host = address[0]
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        super().__init__(address, _Handler)
        self.render = render
        self.scrape = scrape
        self.landing = landing
        self.web = web
        if web.ssl_context is not None:
            # the handshake runs in the request thread, so a silent client blocks nobody else
            self.socket = web.ssl_context.wrap_socket(
                self.socket, server_side=True, do_handshake_on_connect=False
            )

    def handle_error(self, request, client_address) -> None:
        # TLS handshake failures, resets, plain HTTP sent to the HTTPS port: not our problem
        return


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
    ) -> None:
        self.web = web or WebConfig()
        self._server = _Server(address, render, landing, self.web, scrape)
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

    def stop(self) -> None:
        """Stop serving and close the sockets."""
        self._wake_w.send(b"x")
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._server.server_close()
        self._wake_r.close()
        self._wake_w.close()


