"""A stand-in for a Prometheus server that misbehaves, on 127.0.0.1, for tests of the
dashboard's Prometheus source (every API path answers the same way).

Modes (``MODES``): JSON of the wrong shape at several depths, an error with a multi-line
message, an HTML page, a server that drips its answer one byte at a time (each byte well
inside any per-read timeout), and one that reads the request and never answers::

    with BadPrometheus("drip") as server:
        PrometheusSource(server.url, timeout=1.0).status()
        server.requests  # how many requests reached it

Run as a script (``python tests/bad_prometheus.py MODE PORT``) it serves until killed, for
tests that need it in a process of its own.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def _vector(series: Any) -> dict:
    return {"status": "success", "data": {"resultType": "vector", "result": series}}


#: mode -> JSON body (for the JSON modes)
SHAPES: dict[str, Any] = {
    "list": [],
    "data-list": {"status": "success", "data": []},
    "result-object": _vector({}),
    "series-list": _vector([[1, "2"]]),
    "labels-list": _vector([{"metric": [], "value": [1, "2"]}]),
    "short-sample": _vector([{"metric": {}, "value": [1]}]),
    "text-sample": _vector([{"metric": {}, "value": ["soon", "many"]}]),
    "values-object": {"status": "success",
                      "data": {"resultType": "matrix", "result": [{"metric": {}, "values": {}}]}},
    "error-lines": {"status": "error", "errorType": "bad_data",
                    "error": "parse error:\nunexpected <EOF>\n  at char 12"},
}
MODES = (*SHAPES, "html", "drip", "hang")
#: Seconds between two bytes of a dripped answer, and how long a drip lasts at most.
DRIP_EVERY_S = 0.2
DRIP_FOR_S = 120.0


class BadPrometheus:
    """A server on 127.0.0.1 answering every request in ``mode``; a context manager."""

    def __init__(self, mode: str, port: int = 0) -> None:
        if mode not in MODES:
            raise ValueError(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
        self.mode = mode
        self.requests = 0
        self.stopping = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                owner.requests += 1
                owner.answer(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        """Write this mode's answer to one request."""
        if self.mode == "hang":
            self.stopping.wait(DRIP_FOR_S)
            return
        if self.mode == "html":
            body = b"<html><body>Grafana login</body></html>"
            kind = "text/html"
        elif self.mode == "drip":
            body = json.dumps(_vector([])).encode() + b" " * 100_000
            kind = "application/json"
        else:
            body = json.dumps(SHAPES[self.mode]).encode()
            kind = "application/json"
        handler.send_response(400 if self.mode == "error-lines" else 200)
        handler.send_header("Content-Type", kind)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if self.mode != "drip":
            handler.wfile.write(body)
            return
        end = time.monotonic() + DRIP_FOR_S
        for i in range(len(body)):
            if self.stopping.wait(DRIP_EVERY_S) or time.monotonic() > end:
                return
            try:
                handler.wfile.write(body[i:i + 1])
                handler.wfile.flush()
            except OSError:  # the client gave up
                return

    def __enter__(self) -> BadPrometheus:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        self.server.shutdown()
        self.server.server_close()


if __name__ == "__main__":
    with BadPrometheus(sys.argv[1], int(sys.argv[2])) as srv:
        print(f"serving {srv.url} ({srv.mode})", flush=True)
        threading.Event().wait()
