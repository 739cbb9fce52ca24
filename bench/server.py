"""The exporter's HTTP server against the behaviour it replaced, measured in the same run.

1. **keep-alive scrapes**: ``--requests`` GETs of a 100 KB /metrics on one connection, p50/p99,
   with the server as it is (TCP_NODELAY, one write per response) and as it was (two writes,
   Nagle on: each answer waited for the client's delayed ACK).
2. **connection burst**: ``--clients`` threads each opening ``--per-client`` fresh connections at
   once, p99/max and failures, with the listen backlog as it is and as it was (5).
3. **basic auth**: the time to reject a wrong password of a known user and of an unknown user
   (bcrypt cost 10); their ratio should be ~1 (no user-name probing by timing); and the same
   with users of mixed costs (4 and 10: the cost-4 user padded to cost 10).
4. **idle sockets** (issue 20): a server process under an open-files limit of 1,024 holds
   ``--idle`` (1,100) idle connections; then fresh scrapes, p50/max and failures, with the
   connection cap as it is and as it was (none: accept fails with EMFILE).
5. **bcrypt flood** (issue 20): ``--flood`` threads send wrong passwords (cost 10) while a
   scraper with cached credentials and logins of never-seen credentials are timed, with the
   login queue as it is and as it was (unbounded).

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

from exporters import metrics_server as server_mod  # noqa: E402
from exporters.metrics_server import MetricsServer  # noqa: E402

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


def _reject_ms(web, users: tuple[str, ...], tries: int) -> dict[str, float]:
    """Median ms to reject a wrong password of each user, the users alternating (ABBA), so a
    busy machine slows each alike."""
    import base64

    times: dict[str, list[float]] = {user: [] for user in users}
    for i in range(tries):
        for user in (users if i % 2 == 0 else users[::-1]):
            header = "Basic " + base64.b64encode(f"{user}:wrong{i}".encode()).decode()
            t0 = time.perf_counter()
            assert not web.check_authorization(header)
            times[user].append((time.perf_counter() - t0) * 1000)
    return {user: statistics.median(ms) for user, ms in times.items()}


def _web_config(path: Path, costs: dict[str, int]):
    """A loaded web config with one user per entry of ``costs`` (password "right")."""
    import bcrypt

    from exporters.webconfig import load_web_config

    path.write_text("basic_auth_users:\n" + "".join(
        f"  {user}: '{bcrypt.hashpw(b'right', bcrypt.gensalt(rounds=cost)).decode()}'\n"
        for user, cost in costs.items()))
    return load_web_config(path)


def auth_timing(tmp: Path, tries: int) -> tuple[float, float]:
    """Median ms to reject (known user, wrong password) and (unknown user)."""
    ms = _reject_ms(_web_config(tmp / "web.yml", {"prom": 10}), ("prom", "nobody"), tries)
    return ms["prom"], ms["nobody"]


def mixed_cost_timing(tmp: Path, tries: int) -> tuple[float, float, float]:
    """Median ms to reject the cost-4 user and an unknown user when another user has cost 10,
    and the cost-4 user without the padding (as before issue 20)."""
    web = _web_config(tmp / "web-mixed.yml", {"cheap": 4, "dear": 10})
    ms = _reject_ms(web, ("cheap", "nobody"), tries)
    web.pad_hashes = {}  # as before: the cost-4 user checked at cost 4 only
    return ms["cheap"], ms["nobody"], _reject_ms(web, ("cheap",), tries)["cheap"]


def _child_serve(mode: str, port_file: str, web_config: str | None) -> int:
    """Child process: serve BODY until stdin closes. ``before``: as before issue 20, every
    connection admitted, 30 s to send a request, the login queue unbounded."""
    from exporters import webconfig
    from exporters.webconfig import load_web_config

    if mode == "before":
        server_mod._Server.verify_request = lambda self, request, address: True
        server_mod.REQUEST_DEADLINE_S = 30.0
        webconfig.BCRYPT_QUEUE, webconfig.BCRYPT_WAIT_S = 1 << 30, None
    srv = MetricsServer(("127.0.0.1", 0), lambda: BODY, lambda: b"landing",
                        load_web_config(web_config) if web_config else None)
    srv.start()
    Path(port_file).write_text(str(srv.port))
    sys.stdin.read()
    srv.stop()
    return 0


def _spawn_server(mode: str, tmp: Path, web_config: Path | None = None, nofile: int = 1024):
    """(child process, port) of a ``--child-serve`` server limited to ``nofile`` open files."""
    import resource
    import subprocess

    port_file = tmp / f"port-{mode}-{time.monotonic_ns()}"
    argv = [sys.executable, __file__, "--child-serve", mode, "--port-file", str(port_file)]
    if web_config is not None:
        argv += ["--web-config", str(web_config)]
    child = subprocess.Popen(argv, stdin=subprocess.PIPE, preexec_fn=lambda: resource.setrlimit(
        resource.RLIMIT_NOFILE, (nofile, nofile)))
    for _ in range(300):  # 30 s at most to start
        if port_file.exists() and port_file.read_text():
            return child, int(port_file.read_text())
        time.sleep(0.1)
    child.kill()
    raise RuntimeError("the bench server did not start")


def _end(child) -> None:
    child.stdin.close()
    child.wait(timeout=60)


def idle_sockets(mode: str, idle: int, scrapes: int, timeout: float,
                 tmp: Path) -> tuple[list[float], int]:
    """Scrape latencies (ms) and failures with ``idle`` idle connections held open against a
    server process limited to 1,024 open files."""
    child, port = _spawn_server(mode, tmp)
    held: list[socket.socket] = []
    times, failures = [], 0
    try:
        for _ in range(idle):
            held.append(socket.create_connection(("127.0.0.1", port), timeout=10))
        time.sleep(0.5)  # let the server accept what it can
        for _ in range(scrapes):
            t0 = time.perf_counter()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
                    sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: b\r\n"
                                 b"Connection: close\r\n\r\n")
                    _read(sock)
                times.append((time.perf_counter() - t0) * 1000)
            except OSError:
                failures += 1
    finally:
        for s in held:
            s.close()
        _end(child)
    return sorted(times), failures


def login_flood(mode: str, tmp: Path, flood: int, seconds: float) -> dict[str, list]:
    """Under ``flood`` threads of wrong passwords for ``seconds`` (server in its own process):
    latencies (ms) of cached scrapes and (status, ms) of logins with never-seen credentials,
    one a second from another thread."""
    import bcrypt
    import httpx

    users = {"prom": "right", **{f"late{i}": f"pw{i}" for i in range(5)}}
    cfg = tmp / "web-flood.yml"
    if not cfg.exists():
        cfg.write_text("basic_auth_users:\n" + "".join(
            f"  {u}: '{bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=10)).decode()}'\n"
            for u, p in users.items()))
    child, port = _spawn_server(mode, tmp, cfg, nofile=4096)
    url = f"http://127.0.0.1:{port}/metrics"
    out: dict[str, list] = {"cached": [], "fresh": []}
    stop = threading.Event()

    def guess(n: int) -> None:
        with httpx.Client(timeout=120) as client:
            i = 0
            while not stop.is_set():
                i += 1
                try:
                    client.get(url, auth=("nobody", f"g{n}-{i}"))
                except httpx.HTTPError:
                    pass

    def fresh_logins() -> None:
        for i in range(5):
            if stop.wait(1.0):
                return
            t0 = time.perf_counter()
            try:
                code = httpx.get(url, auth=(f"late{i}", f"pw{i}"), timeout=60).status_code
            except httpx.HTTPError:
                code = 0
            out["fresh"].append((code, (time.perf_counter() - t0) * 1000))

    try:
        assert httpx.get(url, auth=("prom", "right"), timeout=10).status_code == 200
        threads = [threading.Thread(target=guess, args=(n,), daemon=True) for n in range(flood)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # the queue fills
        fresher = threading.Thread(target=fresh_logins, daemon=True)
        fresher.start()
        end = time.monotonic() + seconds
        with httpx.Client(timeout=60) as client:  # a keep-alive scraper, like Prometheus
            while time.monotonic() < end:
                t0 = time.perf_counter()
                client.get(url, auth=("prom", "right"))
                out["cached"].append((time.perf_counter() - t0) * 1000)
                time.sleep(0.2)
        stop.set()
        fresher.join(timeout=120)
        for t in threads:
            t.join(timeout=120)
    finally:
        stop.set()
        _end(child)
    return out


def _p(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(len(values) * q))] if values else float("nan")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--per-client", type=int, default=20)
    ap.add_argument("--idle", type=int, default=1100)
    ap.add_argument("--flood", type=int, default=32)
    ap.add_argument("--flood-seconds", type=float, default=8.0)
    ap.add_argument("--child-serve", choices=("now", "before"), help=argparse.SUPPRESS)
    ap.add_argument("--port-file", help=argparse.SUPPRESS)
    ap.add_argument("--web-config", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child_serve:
        return _child_serve(args.child_serve, args.port_file, args.web_config)
    server_mod.raise_open_files_limit()
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
        cheap, nobody, unpadded = mixed_cost_timing(Path(tmp), 15)
        print(f"basic auth rejection (bcrypt cost 10), median of 15: known user {known:.1f} ms, "
              f"unknown user {unknown:.1f} ms, ratio {unknown / known:.2f}")
        print(f"  mixed costs (4 and 10): cost-4 user {cheap:.1f} ms, unknown user "
              f"{nobody:.1f} ms, ratio {nobody / cheap:.2f}; before (no padding): cost-4 user "
              f"{unpadded:.1f} ms, ratio {nobody / unpadded:.1f}")
        i_now, if_now = idle_sockets("now", args.idle, 20, 5.0, Path(tmp))
        i_old, if_old = idle_sockets("before", args.idle, 3, 5.0, Path(tmp))
        print(f"scrapes with {args.idle} idle sockets held, server limited to 1,024 open files:")
        print(f"  now    (cap {server_mod.DEFAULT_MAX_CONNECTIONS}): p50 "
              f"{_median(i_now):7.1f} ms  max {_max(i_now):7.1f} ms  failed {if_now}/20")
        print(f"  before (no cap):   p50 {_median(i_old):7.1f} ms  max {_max(i_old):7.1f} ms  "
              f"failed {if_old}/3 (5 s timeout each)")
        for label in ("now", "before"):
            res = login_flood(label, Path(tmp), args.flood, args.flood_seconds)
            cached = sorted(res["cached"])
            fresh = [f"{code} in {ms:.0f} ms" for code, ms in res["fresh"]]
            print(f"bcrypt flood ({args.flood} threads of wrong passwords, cost 10), {label}:")
            print(f"  cached scrape p50 {_median(cached):7.1f} ms  p99 {_p(cached, 0.99):7.1f} "
                  f"ms  ({len(cached)} scrapes)")
            print(f"  never-seen logins: {', '.join(fresh)}")
    return 0


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _max(values: list[float]) -> float:
    return max(values) if values else float("nan")


if __name__ == "__main__":
    sys.exit(main())
