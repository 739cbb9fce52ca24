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
from exporters.metrics_server import MetricsServer, parse_listen_address
from exporters.registry import BaseCollector, ExporterContext
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


def _gpu_exposition(gpus: int = 2) -> Exposition:
    """The real gpu collector on simulated GPUs, sampled once, behind an Exposition."""
    from exporters.collectors.gpu import GpuCollector
    from exporters.gpu.sim import SimBackend

    ctx = ExporterContext(node="n0", interval=1.0)
    gpu = GpuCollector(ctx, backend=SimBackend("healthy", gpus_per_node=gpus, seed=0))
    gpu.sample_once()
    return Exposition({"gpu": gpu, "fine": Fine(ctx)}, node="n0", version="9.9", backend="sim")


@pytest.fixture
def negotiating_server():
    exp = _gpu_exposition()
    server = MetricsServer(("127.0.0.1", 0), exp.render, lambda: b"landing", scrape=exp.render)
    server.start()
    yield server
    server.stop()


def test_openmetrics_when_asked_with_the_same_series_as_the_text_format(negotiating_server):
    from prometheus_client.openmetrics.parser import text_string_to_metric_families as om_parse
    from prometheus_client.parser import text_string_to_metric_families as text_parse

    url = negotiating_server.url
    with httpx.Client(timeout=10) as client:
        om = client.get(url, headers={"Accept": "application/openmetrics-text; version=1.0.0",
                                      "Accept-Encoding": "gzip"})
        text = client.get(url)
    assert om.headers["content-type"].startswith("application/openmetrics-text; version=1.0.0")
    assert om.headers["content-encoding"] == "gzip"
    assert text.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert om.text.endswith("# EOF\n") and "# EOF" not in text.text
    om_samples = {(s.name, tuple(sorted(s.labels.items())), s.value)
                  for f in om_parse(om.text) for s in f.samples}
    text_samples = {(s.name, tuple(sorted(s.labels.items())), s.value)
                    for f in text_parse(text.text) for s in f.samples}
    # the duration gauge differs from scrape to scrape; every other sample is the same
    assert {s for s in om_samples if "duration" not in s[0]} == \
        {s for s in text_samples if "duration" not in s[0]}


def test_name_filter_keeps_only_the_named_series(negotiating_server):
    url = negotiating_server.url
    with httpx.Client(timeout=10) as client:
        one = client.get(url, params=[("name[]", "verlmon_gpu_up")]).text
        two = client.get(url, params=[("name[]", "verlmon_test_fine"),
                                      ("name[]", "verlmon_collector_errors_total")]).text
        om = client.get(url, params=[("name[]", "verlmon_gpu_up")],
                        headers={"Accept": "application/openmetrics-text"}).text
    names = {line.split("{")[0].split()[0] for line in one.splitlines() if line[0] != "#"}
    assert names == {"verlmon_gpu_up"} and one.count("verlmon_gpu_up{") == 2
    names = {line.split("{")[0].split()[0] for line in two.splitlines() if line[0] != "#"}
    assert names == {"verlmon_test_fine", "verlmon_collector_errors_total"}
    assert om.endswith("# EOF\n") and "verlmon_gpu_up{" in om and "verlmon_build" not in om
