"""The HTTP server under load and attack (issue 12, items 5-7): one write per response with
TCP_NODELAY, a listen backlog that queues a burst, header limits before authentication."""

from __future__ import annotations

import re
import socket
import socketserver
import threading
import time

import bcrypt
import pytest

from exporters import metrics_server as server_mod
from exporters.metrics_server import MetricsServer
from exporters.webconfig import load_web_config

BODY = b"verlmon_x 1\n" * 2000


@pytest.fixture
def plain():
    server = MetricsServer(("127.0.0.1", 0), lambda: BODY, lambda: b"landing")
    server.start()
    yield server
    server.stop()


def read_response(sock: socket.socket) -> tuple[bytes, bytes]:
    """(head, body) of one HTTP/1.1 response with Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "connection closed"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int([h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")][0]
                 .split(b":")[1])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk
        body += chunk
    return head, body


def test_keep_alive_answers_are_one_write_with_nodelay(plain, monkeypatch):
    """Before: headers and body left in two send() calls without TCP_NODELAY, so every
    keep-alive scrape waited ~40 ms for the client's delayed ACK."""
    writes, nodelay = [], []
    real_write = socketserver._SocketWriter.write
    real_setup = server_mod._Handler.setup

    def count_write(self, data):
        writes.append(len(data))
        return real_write(self, data)

    def spy_setup(self):
        real_setup(self)
        nodelay.append(self.request.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))

    monkeypatch.setattr(socketserver._SocketWriter, "write", count_write)
    monkeypatch.setattr(server_mod._Handler, "setup", spy_setup)
    with socket.create_connection(("127.0.0.1", plain.port), timeout=10) as sock:
        for _ in range(3):
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            head, body = read_response(sock)
            assert head.startswith(b"HTTP/1.1 200") and body == BODY
    assert len(writes) == 3 and all(n > len(BODY) for n in writes)
    assert nodelay == [1]


def test_a_burst_of_connections_is_queued_not_dropped():
    """Before: a backlog of 5; connects past the 6th waited for SYN retransmits (1 s+)."""
    server = MetricsServer(("127.0.0.1", 0), lambda: BODY, lambda: b"landing")
    socks = []
    try:  # not started: nothing accepts, so only the kernel's queue holds the connections
        for _ in range(120):
            s = socket.socket()
            s.settimeout(3.0)
            s.connect(("127.0.0.1", server.port))  # times out once the queue is full
            socks.append(s)
        assert len(socks) == 120 and server_mod.BACKLOG >= 128
    finally:
        for s in socks:
            s.close()
        server.stop()


def _send_headers(port: int, count: int, size: int, auth: bool = False) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
        try:
            for i in range(count):
                sock.sendall(b"X-Pad-%d: " % i + b"a" * size + b"\r\n")
            sock.sendall(b"\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed while we were still sending
        data = b""
        try:
            while b"\r\n" not in data:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                data += chunk
        except ConnectionResetError:
            pass
        return data.split(b"\r\n", 1)[0]


def test_large_headers_are_refused_before_auth(tmp_path):
    """Before: 100 header lines of 64 KB each were read and held before auth was checked."""
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    server = MetricsServer(("127.0.0.1", 0), lambda: BODY, lambda: b"landing",
                           load_web_config(cfg))
    server.start()
    try:
        assert _send_headers(server.port, 2, 100).startswith(b"HTTP/1.1 401")
        assert _send_headers(server.port, 40, 4000).startswith(b"HTTP/1.1 431")  # 160 KB
        assert _send_headers(server.port, 1, 70_000).startswith(b"HTTP/1.1 431")
        assert _send_headers(server.port, 150, 10).startswith(b"HTTP/1.1 431")  # too many
        assert _send_headers(server.port, 2, 100).startswith(b"HTTP/1.1 401")  # still serving
    finally:
        server.stop()


def test_a_request_line_over_the_budget_is_431():
    server = MetricsServer(("127.0.0.1", 0), lambda: BODY, lambda: b"landing")
    server.start()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"GET /" + b"a" * (server_mod.MAX_HEADER_BYTES + 10) + b" HTTP/1.1\r\n")
            assert sock.recv(4096).startswith(b"HTTP/1.1 431")
    finally:
        server.stop()


def test_threads_do_not_pile_up(plain):
    before = threading.active_count()
    for _ in range(20):
        with socket.create_connection(("127.0.0.1", plain.port), timeout=10) as sock:
            sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            while sock.recv(65536):
                pass
    assert threading.active_count() <= before + 2


def test_the_accept_loop_survives_an_exception(plain, monkeypatch):
    real = plain._server.handle_request
    calls = {"n": 0}

    def flaky():
        calls["n"] += 1
        if calls["n"] == 1:
            raise OSError(24, "Too many open files")
        return real()

    monkeypatch.setattr(plain._server, "handle_request", flaky)
    for _ in range(2):  # the first connection hits the error and is served on the next pass
        with socket.create_connection(("127.0.0.1", plain.port), timeout=10) as sock:
            sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            assert sock.recv(64).startswith(b"HTTP/1.1 200")
    assert plain.restarts == 1


# --- issue 20: connection cap, whole-request deadline, framing, negotiation, login flood


def _responses(sock: socket.socket, wait: float = 2.0) -> list[bytes]:
    """Every status line the server sends until it closes or goes quiet for ``wait`` s."""
    sock.settimeout(wait)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return re.findall(rb"HTTP/1\.[01] \d{3}", data)  # bodies here never hold that text


@pytest.mark.slow  # it waits on purpose for a timeout
def test_idle_sockets_past_the_cap_make_room_for_a_scrape():
    """Before: idle sockets held a thread and a descriptor each until they ran out, and a
    real scrape then timed out; now the longest-waiting connection makes room."""
    server = MetricsServer(("127.0.0.1", 0), lambda: BODY, lambda: b"landing",
                           max_connections=20)
    server.start()
    idle = []
    try:
        for _ in range(60):
            idle.append(socket.create_connection(("127.0.0.1", server.port), timeout=10))
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            head, body = read_response(sock)
        assert head.startswith(b"HTTP/1.1 200") and body == BODY
        conns = server._server.connections
        assert conns.closed["evicted"] >= 40
        for _ in range(500):  # the evicted connections' threads end (5 s at most)
            if len(conns) <= 21:
                break
            time.sleep(0.01)
        assert len(conns) <= 21
        assert sum(_eof(s, 0.05) for s in idle) >= 40  # closed without a word
    finally:
        for s in idle:
            s.close()
        server.stop()


def _eof(sock: socket.socket, wait: float = 2.0) -> bool:
    try:
        sock.settimeout(wait)
        return sock.recv(1) == b""
    except (TimeoutError, ConnectionResetError):
        return False
    except OSError:
        return True


def test_a_new_connection_is_closed_at_once_when_every_connection_is_busy():
    release = threading.Event()

    def slow_scrape(names, openmetrics):
        release.wait(30)
        return BODY

    server = MetricsServer(("127.0.0.1", 0), lambda: BODY, lambda: b"landing",
                           scrape=slow_scrape, max_connections=2)
    server.start()
    busy = [socket.create_connection(("127.0.0.1", server.port), timeout=10) for _ in range(2)]
    try:
        for sock in busy:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        conns = server._server.connections
        for _ in range(1000):  # both requests parsed and being answered (10 s at most)
            if len(conns) == 2 and all(state[0] is None for state in conns._open.values()):
                break
            time.sleep(0.01)
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as extra:
            assert _eof(extra)  # closed at once, not queued behind the busy ones
        assert server._server.connections.closed["over_cap"] == 1
        release.set()
        for sock in busy:
            assert read_response(sock)[0].startswith(b"HTTP/1.1 200")
    finally:
        release.set()
        for sock in busy:
            sock.close()
        server.stop()


@pytest.mark.slow
def test_a_drip_fed_request_is_cut_off_at_the_deadline(monkeypatch):
    """Before: the 30 s timeout applied to each read, so a byte every second kept a
    connection (and its thread) forever."""
    monkeypatch.setattr(server_mod, "REQUEST_DEADLINE_S", 1.0)
    server = MetricsServer(("127.0.0.1", 0), lambda: BODY, lambda: b"landing")
    server.start()
    sent = 0
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Drip: ")
            try:
                for _ in range(40):  # 8 s of drip at most
                    time.sleep(0.2)
                    sock.sendall(b"a")
                    sent += 1
                    if _eof_nowait(sock):
                        break
            except (BrokenPipeError, ConnectionResetError):
                pass
        assert sent < 40  # cut off long before the drip ended
        assert server._server.connections.closed["deadline"] == 1
    finally:
        server.stop()


def _eof_nowait(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    finally:
        sock.setblocking(True)


def test_keep_alive_and_pipelined_scrapes_still_work(plain):
    with socket.create_connection(("127.0.0.1", plain.port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
        stream = sock.makefile("rb")
        for _ in range(3):  # three answers, one after the other, on one connection
            assert stream.readline().startswith(b"HTTP/1.1 200")
            length = 0
            while (line := stream.readline()) != b"\r\n":
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            assert stream.read(length) == BODY


@pytest.mark.slow  # it waits on purpose for a timeout
@pytest.mark.parametrize("framing", [
    b"Content-Length: %d\r\n",
    b"Content-Length: %d\r\nContent-Length: %d\r\n",
    b"Transfer-Encoding: chunked\r\n",
])
def test_a_body_never_becomes_a_second_request(plain, framing):
    """Before: a GET's body was read as the next request: one GET answered twice."""
    smuggled = b"GET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n"
    head = framing.replace(b"%d", str(len(smuggled)).encode())
    if b"chunked" in framing:
        smuggled = b"%x\r\n" % len(smuggled) + smuggled + b"\r\n0\r\n\r\n"
    with socket.create_connection(("127.0.0.1", plain.port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + head + b"\r\n" + smuggled)
        statuses = _responses(sock)
    assert len(statuses) == 1  # never a 404 for /smuggled
    expected = b"HTTP/1.1 200" if framing.count(b"Content-Length") == 1 else b"HTTP/1.1 400"
    assert statuses[0].startswith(expected)


def test_a_large_body_is_refused(plain):
    with socket.create_connection(("127.0.0.1", plain.port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000\r\n\r\n")
        assert _responses(sock)[0].startswith(b"HTTP/1.1 413")
    assert plain._server.refused["body_too_large"] == 1


def _auth_server(tmp_path, rounds: int = 4, users: dict | None = None) -> MetricsServer:
    cfg = tmp_path / "web.yml"
    users = users or {"prom": "right"}
    lines = [f"  {u}: '{bcrypt.hashpw(p.encode(), bcrypt.gensalt(rounds=rounds)).decode()}'"
             for u, p in users.items()]
    cfg.write_text("basic_auth_users:\n" + "\n".join(lines) + "\n")
    server = MetricsServer(("127.0.0.1", 0), lambda: BODY, lambda: b"landing",
                           load_web_config(cfg))
    server.start()
    return server


def _basic(user: str, password: str) -> bytes:
    import base64

    return b"Authorization: Basic " + base64.b64encode(f"{user}:{password}".encode()) + b"\r\n"


@pytest.mark.parametrize("order", ["good first", "bad first"])
def test_two_authorization_headers_are_a_400(tmp_path, order):
    """Before: of two Authorization headers the first was used (a proxy checking the last
    one would disagree with us)."""
    server = _auth_server(tmp_path)
    good, bad = _basic("prom", "right"), _basic("prom", "wrong")
    pair = good + bad if order == "good first" else bad + good
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + pair + b"\r\n")
            assert _responses(sock)[0].startswith(b"HTTP/1.1 400")
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + good + b"\r\n")
            assert read_response(sock)[0].startswith(b"HTTP/1.1 200")
        assert server._server.refused["duplicate_header"] == 1
    finally:
        server.stop()


@pytest.mark.parametrize("accept_encoding, gzipped", [
    ("gzip", True), ("gzip;q=0", False), ("gzip; q=0.0, identity", False),
    ("identity, *;q=0", False), ("*", True), ("br, gzip;q=0.5", True), ("", False),
])
def test_gzip_only_when_accept_encoding_allows_it(plain, accept_encoding, gzipped):
    """Before: ``gzip;q=0`` (gzip not acceptable) got gzip."""
    import httpx

    r = httpx.get(f"http://127.0.0.1:{plain.port}/metrics", timeout=10,
                  headers={"Accept-Encoding": accept_encoding})
    assert (r.headers.get("content-encoding") == "gzip") is gzipped
    assert r.content == BODY


@pytest.mark.slow
def test_a_login_flood_neither_starves_a_cached_scrape_nor_queues_without_end(tmp_path):
    """Before: 40 logins with wrong passwords all queued for the one bcrypt slot; a new
    login waited behind every one of them (12 s in the issue, past the scrape timeout).
    Now the queue is short: the excess is answered 429 at once, cached scrapes at once."""
    import httpx

    server = _auth_server(tmp_path, rounds=10, users={"prom": "right", "late": "other"})
    url = f"http://127.0.0.1:{server.port}/metrics"
    statuses: list[int] = []
    lock = threading.Lock()
    go = threading.Event()

    def guess(i: int) -> None:
        go.wait()
        r = httpx.get(url, auth=("nobody", f"guess{i}"), timeout=60)
        with lock:
            statuses.append(r.status_code)

    try:
        assert httpx.get(url, auth=("prom", "right"), timeout=10).status_code == 200  # cached
        flood = [threading.Thread(target=guess, args=(i,)) for i in range(40)]
        for t in flood:
            t.start()
        go.set()
        cached = httpx.get(url, auth=("prom", "right"), timeout=10)
        fresh = httpx.get(url, auth=("late", "other"), timeout=10)  # uncached, real password
        for t in flood:
            t.join(timeout=120)
        assert cached.status_code == 200
        assert fresh.status_code in (200, 429)  # answered within the client's 10 s either way
        if fresh.status_code == 429:
            assert fresh.headers["retry-after"] == "1"
        assert sorted(set(statuses)) == [401, 429] and len(statuses) == 40
        refused = server._server.refused["logins_busy"]
        assert refused == statuses.count(429) + (fresh.status_code == 429)
    finally:
        server.stop()
