"""Exposition health wrapping and the HTTP(S) server, scraped for real."""

from __future__ import annotations

import gzip
import shutil
import ssl
import subprocess
from argparse import Namespace
from pathlib import Path

import bcrypt
import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily

from exporters.collectors.nccl import NcclCollector
from exporters.registry import BaseCollector, ExporterContext
from exporters.sampling import SampledCollector
from exporters.server import Exposition, MetricsServer, parse_listen_address
from exporters.webconfig import load_web_config
from exporters.window import RollingWindow

FIXTURE = Path(__file__).parent / "fixtures" / "nccl_inspector" / "gpu-node-01-pid4242.log"


class Exploding(BaseCollector):
    name = "exploding"

    def collect(self):
        yield GaugeMetricFamily("verlmon_test_partial", "written before the failure", value=1)
        raise RuntimeError("sensor fell off")


class FailingSampler(SampledCollector):
    name = "failing"

    def sample(self):
        raise OSError("device busy")


class Fine(BaseCollector):
    name = "fine"

    def collect(self):
        yield GaugeMetricFamily("verlmon_test_fine", "a healthy collector", value=42)


def exposition(tmp_path, store=None) -> Exposition:
    shutil.copy(FIXTURE, tmp_path / FIXTURE.name)
    ctx = ExporterContext(node="n0", interval=1.0, window=RollingWindow(),
                          options=Namespace(nccl_dir=str(tmp_path)))
    nccl = NcclCollector(ctx)
    nccl.sample_once()
    failing = FailingSampler(ctx)
    failing.sample_once()
    return Exposition({"nccl": nccl, "exploding": Exploding(ctx), "failing": failing,
                       "fine": Fine(ctx)}, node="n0", version="9.9", backend="sim", store=store)


def one_scrape(collector) -> dict:
    """Every sample of one collect() call, keyed by (name, sorted label items)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in collector.collect() for s in fam.samples}


def promtool(text: bytes) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                          timeout=60)


def test_a_raising_collector_is_reported_and_the_rest_served(tmp_path):
    exp = exposition(tmp_path)
    text = exp.render()
    assert b"verlmon_test_fine 42.0" in text
    assert b"verlmon_nccl_operations_total" in text
    assert b"verlmon_test_partial" not in text  # a half-built collector is dropped whole
    values = one_scrape(exp)

    def get(name, labels=None):
        return values.get((name, tuple(sorted((labels or {}).items()))))

    assert get("verlmon_collector_success", {"collector": "exploding"}) == 0
    assert get("verlmon_collector_success", {"collector": "failing"}) == 0
    assert get("verlmon_collector_success", {"collector": "fine"}) == 1
    assert get("verlmon_collector_success", {"collector": "nccl"}) == 1
    assert get("verlmon_collector_errors_total", {"collector": "exploding"}) == 2  # 2 scrapes
    assert get("verlmon_collector_errors_total", {"collector": "failing"}) == 1
    assert get("verlmon_collector_duration_seconds", {"collector": "nccl"}) >= 0
    assert get("verlmon_build_info", {"version": "9.9"}) == 1
    assert get("verlmon_node_info", {"node": "n0", "backend": "sim"}) == 1
    assert get("verlmon_store_up") is None  # no store, no store series
    result = promtool(text)
    assert result.returncode == 0, result.stdout + result.stderr


def test_store_health_series(tmp_path):
    class Store:
        up = False
        write_errors = 3

    reg = CollectorRegistry()
    reg.register(exposition(tmp_path, store=Store()))
    assert reg.get_sample_value("verlmon_store_up") == 0
    assert reg.get_sample_value("verlmon_store_write_errors_total") == 3


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
    from tests.test_exporters_webconfig import make_cert

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


def test_fast_formatter_matches_prometheus_client():
    from prometheus_client import exposition as pe
    from prometheus_client.core import CounterMetricFamily, InfoMetricFamily

    from exporters.server import _Families, format_families

    gauge = GaugeMetricFamily("verlmon_x", 'help with \\ and\nnewline', labels=["a", "b"])
    gauge.add_metric(['q"uote', "back\\slash\nnl"], 0.5)
    gauge.add_metric(["z", "y"], float("nan"))
    gauge.add_metric(["inf", "y"], float("inf"))
    gauge.add_metric(["neg", "y"], float("-inf"))
    families = [
        gauge,
        GaugeMetricFamily("verlmon_big", "large values", value=1.50754820096e11),
        GaugeMetricFamily("verlmon_mid", "six digits", value=123456.0),
        GaugeMetricFamily("verlmon_seven", "seven digits", value=1234567.0),
        GaugeMetricFamily("verlmon_round", "a round large number", value=1e7),
        GaugeMetricFamily("verlmon_small", "tiny", value=1.5e-9),
        GaugeMetricFamily("verlmon_negative", "negative", value=-12345678.5),
        GaugeMetricFamily("verlmon_int", "an int", value=3),
        CounterMetricFamily("verlmon_c", "a counter", labels=["k"]),
        InfoMetricFamily("verlmon_i", "info", value={"version": "1"}),
        GaugeMetricFamily("verlmon_empty", "no samples", labels=["k"]),
    ]
    families[8].add_metric(["v"], 7)
    assert format_families(families) == pe.generate_latest(_Families(families))
