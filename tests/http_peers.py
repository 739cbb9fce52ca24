"""Real HTTP peers on 127.0.0.1 for the URL-option tests: a server that demands basic
authentication, and servers that drip their answer byte by byte (headers or body)."""

from __future__ import annotations

import base64
import http.server
import socket
import threading
import time
from collections.abc import Callable

from monitor import metric_names as m


def driver_metrics(step: int = 7, end: float | None = None) -> str:
    """A driver exporter's /metrics text with its last step (what ``--phase-source`` reads)."""
    end = time.time() - 1.0 if end is None else end
    return (f"# TYPE {m.TRAIN_STEP} gauge\n{m.TRAIN_STEP} {step}\n"
            f"# TYPE {m.LAST_STEP_TS} gauge\n{m.LAST_STEP_TS} {end}\n"
            f"# TYPE {m.STEP_DURATION} gauge\n{m.STEP_DURATION} 10.0\n"
            f"# TYPE {m.PHASE_DURATION} gauge\n"
            f'{m.PHASE_DURATION}{{phase="gen"}} 6.0\n{m.PHASE_DURATION}{{phase="update_actor"}} 4.0\n')


class AuthServer:
    """Answers GET with ``body(path)`` (text/plain, or JSON for ``/api/``) when the request
    carries basic authentication for ``user``/``password`` (any request: ``user`` None), else
    401. ``seen`` keeps every
    Authorization header received (None where there was none)."""

    def __init__(self, body: Callable[[str], str], user: str | None, password: str | None,
                 host: str = "127.0.0.1", port: int = 0) -> None:
        want = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.host = host
        self.seen: list[str | None] = []
        peer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:  # noqa: N802 - the http.server API
                got = self.headers.get("Authorization")
                peer.seen.append(got)
                ok = got == want or user is None
                data = body(self.path).encode() if ok else b"unauthorized"
                self.send_response(200 if ok else 401)
                kind = "application/json" if self.path.startswith("/api/") else "text/plain"
                self.send_header("Content-Type", kind)
                self.send_header("Content-Length", str(len(data)))
                if not ok:
                    self.send_header("WWW-Authenticate", 'Basic realm="test"')
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer((host, port), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class DripServer:
    """Accepts connections and answers each one a byte every ``every_s`` seconds, for ever:
    ``part="body"`` sends whole headers (a large Content-Length) and drips the body,
    ``part="headers"`` drips the status line and headers themselves."""

    def __init__(self, part: str = "body", every_s: float = 0.1, host: str = "127.0.0.1",
                 port: int = 0) -> None:
        self.part, self.every_s = part, every_s
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, port))
        self.listener.listen(64)
        self.port = int(self.listener.getsockname()[1])
        self.address = f"{host}:{self.port}"
        self.connections = 0
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        try:
            conn.recv(4096)
            head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000000\r\n\r\n"
            line = b"# HELP vllm:num_requests_running Number of requests running.\n"
            if self.part == "body":
                conn.sendall(head)
                head = b""
            i = 0
            while not self._stop.wait(self.every_s):
                byte = head[i:i + 1] if i < len(head) else line[(i - len(head)) % len(line):][:1]
                conn.sendall(byte)
                i += 1
        except OSError:
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self.listener.close()


class ListSink:
    """A sink that keeps the rollout rows a collector hands it."""

    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add_rollout(self, rows) -> None:
        self.rows.extend(rows)
