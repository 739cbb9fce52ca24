"""The HTTP(S) server, scraped for real: paths, gzip, TLS, basic auth, listen addresses."""

from __future__ import annotations

import gzip
import ssl

import bcrypt
import httpx
import pytest
from prometheus_client.core import GaugeMetricFamily
from tls_cert import make_cert

from exporters.exposition import Exposition
from exporters.registry import BaseCollector, ExporterContext
from exporters.server import MetricsServer, parse_listen_address
from exporters.webconfig import load_web_config


class Fine(BaseCollector):
    name = "fine"

    def collect(self):
        yield GaugeMetricFamily("verlmon_test_fine", "a healthy collector", value=42)


def exposition(_tmp_path=None) -> Exposition:
    ctx = ExporterContext(node="n0", interval=1.0)
    return Exposition({"fine": Fine(ctx)}, node="n0", version="9.9", backend="sim")


@pytest.fixture
def plain_server(tmp_path):
    exp = exposition(tmp_path)
    server = MetricsServer(("127.0.0.1", 0), exp.render, lambda: b"<html>landing</html>")
    server.start()
    yield server
    server.stop()


def test_http_paths(plain_server):
    base = f"http://127.0.0.1:{plain_server.port}"
    assert plain_server.url == f"{base}/metrics"
    with httpx.Client(timeout=10) as client:
        r = client.get(f"{base}/metrics", headers={"Accept-Encoding": "identity"})
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert "verlmon_test_fine 42.0" in r.text
        raw = client.get(f"{base}/metrics", headers={"Accept-Encoding": "gzip"})
        assert raw.headers.get("content-encoding") == "gzip"
        assert "verlmon_build_info" in raw.text  # httpx inflates it
        assert client.get(f"{base}/").text == "<html>landing</html>"
        assert client.get(f"{base}/nothing").status_code == 404
        assert client.head(f"{base}/metrics").status_code == 200


def test_gzip_body_is_valid(plain_server):
    import urllib.request

    req = urllib.request.Request(f"http://127.0.0.1:{plain_server.port}/metrics",
                                 headers={"Accept-Encoding": "gzip"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        assert b"verlmon_build_info" in gzip.decompress(resp.read())


def test_tls_and_basic_auth(tmp_path):
    crt, _ = make_cert(tmp_path)
    hashed = bcrypt.hashpw(b"s3cret-pass", bcrypt.gensalt(rounds=4)).decode()
    cfg = tmp_path / "web.yml"
    cfg.write_text("tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
                   f"basic_auth_users:\n  prom: '{hashed}'\n")
    web = load_web_config(cfg)
    exp = exposition(tmp_path)
    server = MetricsServer(("127.0.0.1", 0), exp.render, lambda: b"landing", web)
    server.start()
    try:
        url = f"https://127.0.0.1:{server.port}/metrics"
        assert server.url.startswith("https://")
        with httpx.Client(verify=ssl.create_default_context(cafile=str(crt)), timeout=10) as client:
            denied = client.get(url)
            assert denied.status_code == 401
            assert "Basic" in denied.headers["www-authenticate"]
            assert client.get(url, auth=("prom", "wrong")).status_code == 401
            assert client.get(url.replace("/metrics", "/"), auth=("prom", "nope")
                              ).status_code == 401
            ok = client.get(url, auth=("prom", "s3cret-pass"))
            assert ok.status_code == 200 and "verlmon_build_info" in ok.text
            assert "s3cret-pass" not in ok.text and hashed not in ok.text
        # plain HTTP to the TLS port does not work, and does not stop the server
        with pytest.raises(httpx.HTTPError):
            httpx.get(f"http://127.0.0.1:{server.port}/metrics", timeout=5)
        with httpx.Client(verify=ssl.create_default_context(cafile=str(crt)), timeout=10) as client:
            assert client.get(url, auth=("prom", "s3cret-pass")).status_code == 200
    finally:
        server.stop()


@pytest.mark.parametrize(
    "text, expected",
    [("127.0.0.1:9048", ("127.0.0.1", 9048)), (":0", ("0.0.0.0", 0)),
     ("[::1]:80", ("::1", 80))],
)
def test_listen_addresses(text, expected):
    assert parse_listen_address(text) == expected


@pytest.mark.parametrize("text", ["9048", "host:port", "h:70000"])
def test_bad_listen_addresses(text):
    with pytest.raises(ValueError, match="listen address"):
        parse_listen_address(text)
