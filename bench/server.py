"""The exporter's HTTP server against the behaviour it replaced, measured in the same run.

1. **keep-alive scrapes**: ``--requests`` GETs of a 100 KB /metrics on one connection, p50/p99,
   with the server as it is (TCP_NODELAY, one write per response) and as it was (two writes,
   Nagle on: each answer waited for the client's delayed ACK).
2. **connection burst**: ``--clients`` threads each opening ``--per-client`` fresh connections at
   once, p99/max and failures, with the listen backlog as it is and as it was (5).
3. **basic auth**: the time to reject a wrong password of a known user and of an unknown user
   (bcrypt cost 10); their ratio should be ~1 (no user-name probing by timing).

Prints each pair and its ratio (before / now). 127.0.0.1 only.

    .venv/bin/python bench/server.py
"""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporters import server as server_mod  # noqa: E402
from exporters.server import MetricsServer  # noqa: E402

BODY = b"verlmon_bench_series{gpu=\"0\"} 1.0\n" * 100  # ~3.5 KB: a gzipped scrape


class _OldHandler(server_mod._Handler):
    """The former answer path: Nagle on, headers and body in two writes."""

    def setup(self) -> None:
        super().setup()
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 0)

    def _send(self, code, body, ctype, headers=None) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def _server(old_handler: bool = False, backlog: int | None = None) -> MetricsServer:
    saved_backlog = server_mod._Server.request_queue_size
    if backlog is not None:
        server_mod._Server.request_queue_size = backlog
    try:
        srv = MetricsServer(("127.0.0.1", 0), lambda: BODY, lambda: b"landing")
    finally:
        server_mod._Server.request_queue_size = saved_backlog
    if old_handler:
        srv._server.RequestHandlerClass = _OldHandler
    srv.start()
    return srv


def _read(sock: socket.socket) -> None:
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)


def keep_alive(old: bool, requests: int) -> list[float]:
    srv = _server(old_handler=old)
    times = []
    try:
        with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
            for _ in range(requests):
                t0 = time.perf_counter()
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: b\r\n\r\n")
                _read(sock)
                times.append((time.perf_counter() - t0) * 1000)
    finally:
        srv.stop()
    return sorted(times)


def burst(backlog: int | None, clients: int, per_client: int) -> tuple[list[float], int]:
    srv = _server(backlog=backlog)
    times: list[float] = []
    failures = [0]
    lock = threading.Lock()
    start = threading.Event()

    def client() -> None:
        start.wait()
        for _ in range(per_client):
            t0 = time.perf_counter()
            try:
                with socket.create_connection(("127.0.0.1", srv.port), timeout=10) as sock:
                    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
                    _read(sock)
                ms = (time.perf_counter() - t0) * 1000
                with lock:
                    times.append(ms)
            except OSError:
                with lock:
                    failures[0] += 1

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for t in threads:
        t.start()
    start.set()
    for t in threads:
        t.join()
    srv.stop()
    return sorted(times), failures[0]


def auth_timing(tmp: Path, tries: int) -> tuple[float, float]:
    """Median ms to reject (known user, wrong password) and (unknown user)."""
    import base64

    import bcrypt

    from exporters.webconfig import load_web_config

    cfg = tmp / "web.yml"
    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=10)).decode()
    cfg.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    web = load_web_config(cfg)
    times: dict[str, list[float]] = {"prom": [], "nobody": []}
    for i in range(tries):  # alternating (ABBA), so a busy machine slows both alike
        for user in (("prom", "nobody") if i % 2 == 0 else ("nobody", "prom")):
            header = "Basic " + base64.b64encode(f"{user}:wrong{i}".encode()).decode()
            t0 = time.perf_counter()
            assert not web.check_authorization(header)
            times[user].append((time.perf_counter() - t0) * 1000)
    return statistics.median(times["prom"]), statistics.median(times["nobody"])


def _p(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(len(values) * q))] if values else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--per-client", type=int, default=20)
    args = ap.parse_args()
    now, before = keep_alive(False, args.requests), keep_alive(True, args.requests)
    print(f"keep-alive scrape of {len(BODY)} bytes, {args.requests} requests:")
    print(f"  now    p50 {statistics.median(now):7.2f} ms  p99 {_p(now, 0.99):7.2f} ms")
    print(f"  before p50 {statistics.median(before):7.2f} ms  p99 {_p(before, 0.99):7.2f} ms")
    print(f"  before/now p50 ratio {statistics.median(before) / statistics.median(now):.1f}x")
    b_now, f_now = burst(None, args.clients, args.per_client)
    b_old, f_old = burst(5, args.clients, args.per_client)
    print(f"burst: {args.clients} clients x {args.per_client} new connections:")
    print(f"  backlog {server_mod.BACKLOG:4d}: p99 {_p(b_now, 0.99):7.1f} ms  max "
          f"{b_now[-1] if b_now else float('nan'):7.1f} ms  failed {f_now}")
    print(f"  backlog    5: p99 {_p(b_old, 0.99):7.1f} ms  max "
          f"{b_old[-1] if b_old else float('nan'):7.1f} ms  failed {f_old}")
    print(f"  before/now p99 ratio {_p(b_old, 0.99) / _p(b_now, 0.99):.1f}x")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        known, unknown = auth_timing(Path(tmp), 15)
    print(f"basic auth rejection (bcrypt cost 10), median of 15: known user {known:.1f} ms, "
          f"unknown user {unknown:.1f} ms, ratio {unknown / known:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
