"""The Kubernetes recipe's phase source: every DaemonSet exporter is given the headless
Service's name (``--phase-source=$(VERLMON_PHASE_SOURCE)``), which resolves to every node's
exporter; the one serving steps (the driver's node follows the log) is the phase source.

Real HTTP servers on two loopback addresses with one port stand in for two pods behind the
Service; the name's resolution is the one seam (``resolve``), as DNS is the cluster's.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from monitor import metric_names as m
from monitor.live.phase_timeline import PhaseSource, PhaseSourceError

REPO = Path(__file__).resolve().parents[1]
DRIVER_TEXT = (f"{m.TRAIN_STEP} 7\n{m.LAST_STEP_TS} 1700000030\n{m.STEP_DURATION} 30\n"
               f'{m.PHASE_DURATION}{{phase="gen"}} 15\n'
               f'{m.PHASE_DURATION}{{phase="update_actor"}} 6\n')
OTHER_TEXT = "verlmon_gpu_up 1\n"  # a node without the log: GPUs, no steps


class _Exporter:
    """A /metrics server on ``addr`` (port 0: a free one, or the given port)."""

    def __init__(self, addr: str, text: str, port: int = 0) -> None:
        body = text.encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer((addr, port), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def two_pods():
    """The driver's exporter on 127.0.0.2 and another node's on 127.0.0.1, one port."""
    other = _Exporter("127.0.0.1", OTHER_TEXT)
    try:
        driver = _Exporter("127.0.0.2", DRIVER_TEXT, other.port)
    except OSError as exc:
        other.close()
        pytest.skip(f"cannot bind 127.0.0.2: {exc}")
    yield other.port
    driver.close()
    other.close()


def _service(host: str, port: int) -> list[str]:
    assert host == "verl-monitor-exporter.verl-monitor.svc"
    return ["127.0.0.1", "127.0.0.2"]


@pytest.mark.slow  # it waits on purpose for a timeout
def test_headless_service_name_finds_the_driver_among_every_node(two_pods):
    url = f"http://verl-monitor-exporter.verl-monitor.svc:{two_pods}/metrics"
    src = PhaseSource(url, resolve=_service)
    assert src.candidates() == [f"http://127.0.0.1:{two_pods}/metrics",
                                f"http://127.0.0.2:{two_pods}/metrics"]
    rec = src.fetch()
    assert rec is not None and rec.step == 7 and rec.phases["update_actor"] == 6
    assert src.driver == f"http://127.0.0.2:{two_pods}/metrics"
    assert src.fetch().step == 7  # read from the remembered driver


def test_no_driver_yet_is_no_step_and_every_pod_down_is_one_error(two_pods):
    # before the job writes its first step: no address has steps, nothing is attributed
    src = PhaseSource(f"http://verl-monitor-exporter.verl-monitor.svc:{two_pods}/metrics",
                      resolve=lambda host, port: ["127.0.0.1", "127.0.0.3"])
    assert src.fetch() is None  # 127.0.0.3 refuses, 127.0.0.1 has no steps
    down = PhaseSource("http://verl-monitor-exporter.verl-monitor.svc:1/metrics",
                       resolve=lambda host, port: ["127.0.0.3", "127.0.0.4"])
    with pytest.raises(PhaseSourceError, match="cannot read http://127.0.0.3:1/metrics"):
        down.fetch()


def test_daemonset_points_every_node_at_the_service_it_sits_behind():
    docs = {d["kind"]: d for path in (REPO / "deploy" / "kubernetes").glob("*.yaml")
            for d in yaml.safe_load_all(path.read_text()) if d}
    ds, svc = docs["DaemonSet"], docs["Service"]
    container = ds["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e for e in container["env"]}
    url = env["VERLMON_PHASE_SOURCE"]["value"]
    assert "--phase-source=$(VERLMON_PHASE_SOURCE)" in container["args"]
    name, ns = svc["metadata"]["name"], svc["metadata"]["namespace"]
    port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "metrics")
    assert url == f"http://{name}.{ns}.svc:{port}/metrics"
    assert svc["spec"]["clusterIP"] == "None"  # headless: one address per node's exporter
