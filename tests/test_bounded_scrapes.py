"""Issue 30 row 6: every scrape of a rollout server and every phase-source read has one overall
deadline, so a server that drips its answer byte by byte cannot hold a worker past it, slow
servers cannot starve a healthy one, and the exporter stops at once whatever they do. Real
dripping servers on 127.0.0.1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from exporters.collectors.rollout_engine import MAX_WORKERS, RolloutEngineCollector
from exporters.options import ExporterOptions
from exporters.registry import ExporterContext
from monitor import metric_names as m
from monitor.live.phase_timeline import PhaseSource, PhaseSourceError
from monitor.sim.engine_server import EngineServer
from tests.http_peers import AuthServer, DripServer, ListSink, driver_metrics
from tests.ports import free_port

pytestmark = pytest.mark.slow


def collector(targets: list[str], timeout: float) -> tuple[RolloutEngineCollector, ListSink]:
    sink = ListSink()
    opts = ExporterOptions(rollout_server=tuple(targets), rollout_timeout=timeout)
    return RolloutEngineCollector(ExporterContext(node="n0", interval=1.0, sink=sink,
                                                  options=opts)), sink


def scrape_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("rollout-scrape")
            and t.is_alive()]


def gone(check, within: float = 10.0) -> bool:
    """Whether ``check()`` becomes true within ``within`` seconds (a bound, not a measure)."""
    end = time.monotonic() + within
    while time.monotonic() < end:
        if check():
            return True
        time.sleep(0.05)
    return check()


@pytest.mark.parametrize("part", ["body", "headers"])
def test_a_dripping_server_is_cut_at_the_deadline_and_frees_its_worker(part: str) -> None:
    """Before: the worker read the drip for ever (each byte within the socket timeout); the
    next rounds found the server still busy, and the thread outlived close()."""
    drip = DripServer(part)
    try:
        col, sink = collector([drip.address], timeout=0.5)
        assert col.sample_once()
        server = col.servers[drip.address]
        assert server.errors == {"timeout": 1} and not server.up
        # the worker is free again: the next round scrapes the server anew (not 'still busy')
        assert gone(lambda: not server.busy)
        assert col.sample_once()
        assert server.errors == {"timeout": 2} and drip.connections == 2
        col.close()
        assert gone(lambda: not scrape_threads()), scrape_threads()
    finally:
        drip.close()


def test_dripping_servers_cannot_starve_a_healthy_one() -> None:
    """Before: 17 dripping servers (one more than the workers) left every server dark, the
    healthy one too, round after round."""
    drips = [DripServer("body") for _ in range(MAX_WORKERS + 1)]
    healthy = EngineServer("vllm").start()
    try:
        col, sink = collector([d.address for d in drips] + [healthy.url], timeout=1.0)
        for round_no in range(1, 4):
            assert col.sample_once()
            assert col.servers[healthy.address].up, f"round {round_no}"
            assert [r["server"] for r in sink.rows][-1] == healthy.address
        assert len(sink.rows) == 3
        assert all(col.servers[d.address].errors.get("timeout") == 3 for d in drips)
        col.close()
        assert gone(lambda: not scrape_threads())
    finally:
        healthy.stop()
        for d in drips:
            d.close()


def test_a_dripping_phase_source_is_an_error_at_the_deadline() -> None:
    """Before: urllib's read of a dripping driver never ended: the phase-gpu thread hung."""
    drip = DripServer("body")
    try:
        source = PhaseSource(f"http://{drip.address}/metrics", timeout=0.5)
        out: list[object] = []

        def read() -> None:
            try:
                out.append(source.fetch())
            except PhaseSourceError as exc:
                out.append(exc)

        t = threading.Thread(target=read, daemon=True)
        t.start()
        t.join(10.0)
        assert not t.is_alive(), "the read did not stop at its deadline"
        assert isinstance(out[0], PhaseSourceError) and "0.5 s" in str(out[0])
    finally:
        drip.close()


def test_dripping_exporters_behind_one_name_cannot_hide_the_driver() -> None:
    """``--phase-source`` naming a headless Service: 20 addresses drip, one is the driver.
    Before: they were read one after the other, a timeout each (20 s) before the driver."""
    port = free_port()
    drips = [DripServer("body", host=f"127.0.0.{i}", port=port) for i in range(2, 22)]
    driver = AuthServer(lambda path: driver_metrics(step=11), None, None, host="127.0.0.30",
                        port=port)
    try:
        hosts = [d.address.split(":")[0] for d in drips] + ["127.0.0.30"]
        source = PhaseSource(f"http://verl-monitor-exporter:{port}/metrics", timeout=1.0,
                             resolve=lambda host, p: hosts)
        rec = in_thread(source.fetch, within=8.0)
        assert rec is not None and rec.step == 11
        assert source.driver == f"http://127.0.0.30:{port}/metrics"
    finally:
        driver.close()
        for d in drips:
            d.close()


def in_thread(fn, within: float):
    """``fn()``'s result; AssertionError when it still runs after ``within`` seconds."""
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(within)
    assert not t.is_alive(), f"still reading after {within:g} s"
    return out[0]


def test_sigterm_stops_the_exporter_whatever_the_servers_do(tmp_path: Path) -> None:
    """Before: one dripping server made SIGTERM wait about 100 s."""
    drips = [DripServer(part) for part in ("body", "headers") * 9]
    port = free_port()
    args = [sys.executable, "-m", "monitor", "exporter", "--listen-address",
            f"127.0.0.1:{port}", "--gpu-backend", "sim", "--sim-gpus", "1",
            "--rollout-interval", "0.5", "--rollout-timeout", "1",
            "--phase-source", f"http://{drips[0].address}/metrics"]
    for d in drips:
        args += ["--rollout-server", d.address]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parent.parent,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        import urllib.request

        def up() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    return m.ROLLOUT_SCRAPE_ERRORS in r.read().decode()
            except OSError:
                return False

        assert gone(up, within=60.0)
        time.sleep(2.0)  # every worker is inside a drip now
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()
        for d in drips:
            d.close()
    assert code == 0 and took < 10.0, (code, took)
