"""Web config (issue 12, items 4 and 8): every key applied or refused in one line, and basic
auth that cannot be used to pin the CPU, probe user names or flush the cache."""

from __future__ import annotations

import base64
import ssl
import threading
import time

import bcrypt
import httpx
import pytest
from tls_cert import make_cert

from exporters import webconfig
from exporters.metrics_server import MetricsServer
from exporters.webconfig import WebConfigError, load_web_config

TLS = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"


def serve(tmp_path, text: str):
    make_cert(tmp_path)
    cfg = tmp_path / "web.yml"
    cfg.write_text(text)
    server = MetricsServer(("127.0.0.1", 0), lambda: b"verlmon_x 1\n", lambda: b"landing",
                           load_web_config(cfg))
    server.start()
    return server


def client_context(tmp_path, **settings) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(tmp_path / "server.crt"))
    for key, value in settings.items():
        if key == "ciphers":
            ctx.set_ciphers(value)
        elif key == "curve":
            ctx.set_ecdh_curve(value)
        else:
            setattr(ctx, key, value)
    return ctx


def test_max_version_is_applied(tmp_path):
    """Before: max_version: TLS12 was accepted and a default client still got TLS 1.3."""
    server = serve(tmp_path, TLS + "  max_version: TLS12\n")
    try:
        with httpx.Client(verify=client_context(tmp_path), timeout=10) as c:
            r = c.get(server.url, extensions={})
            assert r.status_code == 200
            stream = r.extensions["network_stream"]
            assert stream.get_extra_info("ssl_object").version() == "TLSv1.2"
        with pytest.raises(httpx.ConnectError):  # a TLS 1.3-only client is refused
            httpx.get(server.url, verify=client_context(
                tmp_path, minimum_version=ssl.TLSVersion.TLSv1_3), timeout=10)
    finally:
        server.stop()


def test_cipher_suites_are_applied(tmp_path):
    """Before: a TLS 1.2 client offering only CHACHA20 connected despite cipher_suites."""
    server = serve(tmp_path, TLS + "  max_version: TLS12\n  prefer_server_cipher_suites: true\n"
                   "  cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]\n")
    try:
        with pytest.raises(httpx.ConnectError):
            httpx.get(server.url, timeout=10, verify=client_context(
                tmp_path, ciphers="ECDHE-ECDSA-CHACHA20-POLY1305"))
        r = httpx.get(server.url, timeout=10, verify=client_context(
            tmp_path, ciphers="ECDHE-ECDSA-AES128-GCM-SHA256"))
        assert r.status_code == 200
    finally:
        server.stop()


def test_one_curve_is_applied(tmp_path):
    server = serve(tmp_path, TLS + "  curve_preferences: [CurveP384]\n")
    try:
        with pytest.raises(httpx.ConnectError):
            httpx.get(server.url, timeout=10, verify=client_context(tmp_path, curve="X25519"))
        r = httpx.get(server.url, timeout=10, verify=client_context(tmp_path, curve="secp384r1"))
        assert r.status_code == 200
    finally:
        server.stop()


def test_http_server_config_headers_are_sent(tmp_path):
    """Before: http_server_config was accepted and ignored."""
    server = serve(tmp_path, "http_server_config:\n  http2: false\n  headers:\n"
                   "    X-Frame-Options: deny\n    X-Content-Type-Options: nosniff\n")
    try:
        for path in ("/metrics", "/", "/nope"):
            r = httpx.get(server.url.replace("/metrics", path), timeout=10)
            assert r.headers["x-frame-options"] == "deny"
            assert r.headers["x-content-type-options"] == "nosniff"
    finally:
        server.stop()


@pytest.mark.parametrize("text, message", [
    (TLS + "  curve_preferences: [X25519, CurveP256]\n",
     "tls_server_config.curve_preferences: this server can apply one curve only"),
    (TLS + "  curve_preferences: [CurveP999]\n", "curve_preferences: unknown CurveP999"),
    (TLS + "  cipher_suites: [TLS_FAKE_WITH_NOTHING]\n",
     "cipher_suites: unknown or unsupported TLS_FAKE_WITH_NOTHING"),
    (TLS + "  max_version: TLS14\n", "tls_server_config.max_version must be one of"),
    (TLS + "  min_version: TLS13\n  max_version: TLS12\n", "min_version is above max_version"),
    (TLS + "  prefer_server_cipher_suites: sometimes\n", "prefer_server_cipher_suites must"),
    ("http_server_config:\n  http2: true\n", "http_server_config.http2: this exporter serves"),
    ("http_server_config:\n  headers:\n    Set-Cookie: a=b\n",
     "http_server_config.headers: 'Set-Cookie' cannot be set"),
    ("http_server_config:\n  speed: fast\n", "unknown key(s) in http_server_config: speed"),
    ("basic_auth_users:\n  alice: $2y$10$tooShort\n", "basic_auth_users.alice: the bcrypt "
     "hash is malformed"),
])
def test_settings_that_cannot_be_honoured_are_refused_in_one_line(tmp_path, text, message):
    make_cert(tmp_path)
    cfg = tmp_path / "web.yml"
    cfg.write_text(text)
    with pytest.raises(WebConfigError) as info:
        load_web_config(cfg)
    assert message in str(info.value) and str(cfg) in str(info.value)
    assert "\n" not in str(info.value)


def test_a_truncated_hash_is_refused_at_load(tmp_path):
    """Before: a truncated bcrypt hash loaded fine and every login then failed."""
    good = bcrypt.hashpw(b"pw", bcrypt.gensalt(rounds=4)).decode()
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"basic_auth_users:\n  prom: '{good[:-5]}'\n")
    with pytest.raises(WebConfigError, match="prom: the bcrypt hash is malformed"):
        load_web_config(cfg)
    cfg.write_text(f"basic_auth_users:\n  prom: '{good}'\n")
    assert load_web_config(cfg).users["prom"] == good.encode()


def test_a_binary_file_is_one_line(tmp_path):
    """Before: UnicodeDecodeError traceback."""
    cfg = tmp_path / "web.yml"
    cfg.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(WebConfigError) as info:
        load_web_config(cfg)
    assert str(info.value) == f"{cfg}: not a text file (expected UTF-8 YAML)"


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


@pytest.fixture
def auth_config(tmp_path, monkeypatch):
    hashed = bcrypt.hashpw(b"right", bcrypt.gensalt(rounds=4)).decode()
    cfg = tmp_path / "web.yml"
    cfg.write_text(f"basic_auth_users:\n  prom: '{hashed}'\n")
    web = load_web_config(cfg)
    calls = {"n": 0, "active": 0, "max_active": 0}
    lock = threading.Lock()
    real = bcrypt.checkpw

    def spy(password, hashed_pw):
        with lock:
            calls["n"] += 1
            calls["active"] += 1
            calls["max_active"] = max(calls["max_active"], calls["active"])
        try:
            time.sleep(0.01)  # long enough for parallel callers to overlap if allowed
            return real(password, hashed_pw)
        finally:
            with lock:
                calls["active"] -= 1

    monkeypatch.setattr(bcrypt, "checkpw", spy)
    return web, calls


def test_unknown_users_cost_a_bcrypt_check_like_known_ones(auth_config):
    """Before: an unknown user was rejected without bcrypt (faster), so names could be
    probed by timing."""
    web, calls = auth_config
    assert not web.check_authorization(_basic("nobody", "x"))
    assert calls["n"] == 1
    assert not web.check_authorization(_basic("prom", "x"))
    assert calls["n"] == 2
    assert web.dummy_hash is not None and web.dummy_hash.startswith(b"$2b$04$")


def test_bcrypt_checks_run_one_at_a_time(auth_config):
    """Before: 8 clients with distinct wrong passwords pinned every core."""
    web, calls = auth_config
    busy = []

    def login(i: int) -> None:
        try:
            web.check_authorization(_basic("prom", f"guess{i}"))
        except webconfig.LoginsBusy:  # past the waiting queue: refused at once (429)
            busy.append(i)

    threads = [threading.Thread(target=login, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert calls["n"] + len(busy) == 8 and calls["n"] >= 1
    assert calls["max_active"] == webconfig.BCRYPT_CONCURRENCY == 1
    assert len(busy) == web.busy_refusals


@pytest.mark.slow
def test_wrong_passwords_cannot_flush_the_good_entry(auth_config):
    """Before: 1,100 distinct wrong passwords flushed the 1,024-entry cache."""
    web, calls = auth_config
    assert web.check_authorization(_basic("prom", "right"))
    assert calls["n"] == 1
    for i in range(1100):
        assert not web.check_authorization(_basic("prom", f"wrong{i}"))
    before = calls["n"]
    assert web.check_authorization(_basic("prom", "right"))
    assert calls["n"] == before  # still cached: no bcrypt for the real scraper
    assert len(web._cache) <= webconfig.CACHE_SIZE


def test_mixed_costs_cost_every_login_the_same_bcrypt_work(tmp_path, monkeypatch):
    """Before (issue 20): with users of bcrypt costs 4 and 7, a wrong password for the cost-4
    user cost 2^4 rounds, an unknown user 2^7: timing told which users exist."""
    cfg = tmp_path / "web.yml"
    cheap = bcrypt.hashpw(b"a", bcrypt.gensalt(rounds=4)).decode()
    dear = bcrypt.hashpw(b"b", bcrypt.gensalt(rounds=7)).decode()
    cfg.write_text(f"basic_auth_users:\n  cheap: '{cheap}'\n  dear: '{dear}'\n")
    web = load_web_config(cfg)
    work: list[int] = []
    real = bcrypt.checkpw

    def spy(password, hashed_pw):
        work.append(2 ** int(hashed_pw[4:6]))  # bcrypt rounds grow as 2^cost
        return real(password, hashed_pw)

    monkeypatch.setattr(bcrypt, "checkpw", spy)
    spent = {}
    for user in ("cheap", "dear", "nobody"):
        work.clear()
        assert not web.check_authorization(_basic(user, "wrong"))
        spent[user] = sum(work)
    assert spent == {"cheap": 2 ** 7, "dear": 2 ** 7, "nobody": 2 ** 7}
    work.clear()
    assert web.check_authorization(_basic("cheap", "a"))  # the right password still works
    assert sum(work) == 2 ** 7


def test_a_full_login_queue_is_refused_at_once(auth_config, monkeypatch):
    """Before (issue 20): every login queued for the bcrypt slot, however long the queue:
    under a flood an uncached login waited 12 s, past Prometheus's scrape timeout."""
    web, calls = auth_config
    monkeypatch.setattr(webconfig, "BCRYPT_QUEUE", 2)
    assert web.check_authorization(_basic("prom", "right"))  # cached from now on
    web._bcrypt_slots.acquire()  # a check in progress holds the slot
    outcomes: list[str] = []

    def login(i: int) -> None:
        try:
            outcomes.append("ok" if web.check_authorization(_basic("prom", f"g{i}")) else "no")
        except webconfig.LoginsBusy:
            outcomes.append("busy")

    waiting = [threading.Thread(target=login, args=(i,)) for i in range(2)]
    for t in waiting:
        t.start()
    for _ in range(1000):  # both queued behind the held slot (10 s at most)
        if web._waiting == 2:
            break
        time.sleep(0.01)
    login(99)  # the queue is full: refused at once, not queued
    assert outcomes == ["busy"]
    assert web.check_authorization(_basic("prom", "right"))  # cached: no queue at all
    web._bcrypt_slots.release()
    for t in waiting:
        t.join(timeout=30)
    assert sorted(outcomes) == ["busy", "no", "no"] and web.busy_refusals == 1
