"""The HTTP server under load and attack (issue 12, items 5-7): one write per response with
TCP_NODELAY, a listen backlog that queues a burst, header limits before authentication."""

from __future__ import annotations

import socket
import socketserver
import threading

import bcrypt
import pytest

from exporters import server as server_mod
from exporters.server import MetricsServer
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
