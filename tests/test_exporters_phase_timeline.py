"""The driver's phase timeline on other nodes: read from its /metrics over real HTTP, joined
with this node's GPU samples, counted per phase and GPU."""

from __future__ import annotations

import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from exporters.options import ExporterOptions
from monitor.live import ViewContext
from monitor.live.phase_gpu_counter import PhaseGpuCollector
from monitor.live.phase_timeline import (
    PhaseGpuTotals,
    PhaseSourceError,
    fetch_step,
    step_from_metrics,
)
from monitor.live.rolling_window import RollingWindow
from monitor.records import StepRecord

END = 1_800_000_100.0
#: A driver's /metrics after step 7: 6 s of generation, then 4 s of update_actor.
DRIVER = f"""# HELP verlmon_training_step Last training step number seen in the log.
# TYPE verlmon_training_step gauge
verlmon_training_step 7.0
# TYPE verlmon_step_duration_seconds gauge
verlmon_step_duration_seconds 10.0
# TYPE verlmon_phase_duration_seconds gauge
verlmon_phase_duration_seconds{{phase="gen"}} 6.0
verlmon_phase_duration_seconds{{phase="update_actor"}} 4.0
# TYPE verlmon_last_step_timestamp_seconds gauge
verlmon_last_step_timestamp_seconds {END}
"""


def gpu_rows(node: str = "node3", gpus: int = 2) -> list[dict]:
    """Samples every second over the step: SM 50% in generation, 90% in update_actor (GPU 1
    at half of that), utilization 95% throughout."""
    rows = []
    for i in range(10):
        ts = END - 10 + i + 0.5
        for g in range(gpus):
            sm = 50.0 if i < 6 else 90.0
            rows.append({"ts": ts, "node": node, "gpu": g, "util": 95.0,
                         "sm_active": sm if g == 0 else sm / 2, "mem_used_bytes": 1.0,
                         "mem_total_bytes": 2.0, "power_w": None, "tensor_active": None,
                         "dram_active": None})
    return rows


def test_last_step_is_read_from_the_drivers_metrics():
    rec = step_from_metrics(DRIVER)
    assert rec.step == 7 and rec.end_time == END and rec.total == 10.0
    assert rec.phases == {"gen": 6.0, "update_actor": 4.0}
    assert step_from_metrics("# TYPE verlmon_node_info gauge\nverlmon_node_info 1\n") is None
    with pytest.raises(PhaseSourceError):
        step_from_metrics("this is not { prometheus")


def test_samples_are_counted_per_phase_and_gpu():
    import pandas as pd

    totals = PhaseGpuTotals()
    n = totals.add_step(step_from_metrics(DRIVER), pd.DataFrame(gpu_rows()))
    assert n == 20
    seconds, sm, util, samples = totals.snapshot()
    assert seconds == {("gen", "0"): 6.0, ("gen", "1"): 6.0, ("update_actor", "0"): 4.0,
                       ("update_actor", "1"): 4.0}
    assert sm[("gen", "0")] == pytest.approx(3.0) and sm[("update_actor", "0")] == pytest.approx(3.6)
    assert sm[("update_actor", "1")] == pytest.approx(1.8)  # the slow GPU, named by index
    assert util[("gen", "1")] == pytest.approx(5.7)
    assert samples == {("gen", "0"): 6, ("gen", "1"): 6, ("update_actor", "0"): 4,
                       ("update_actor", "1"): 4}


def test_a_phase_shorter_than_the_sampling_interval_shows_in_the_sample_count():
    import pandas as pd

    rec = StepRecord(step=1, end_time=END, total=10.0,
                     phases={"gen": 9.7, "update_actor": 0.3})
    totals = PhaseGpuTotals()
    totals.add_step(rec, pd.DataFrame(gpu_rows(gpus=1)))
    seconds, _, _, samples = totals.snapshot()
    assert samples.get(("update_actor", "0"), 0) <= 1 and samples[("gen", "0")] >= 9
    # no sample inside it: no seconds either, so rate(sm) / rate(seconds) is never invented
    assert (("update_actor", "0") in seconds) == (samples.get(("update_actor", "0"), 0) > 0)


class _Driver:
    """A stand-in driver exporter: serves DRIVER (or 500) on 127.0.0.1."""

    def __init__(self, text: str = DRIVER, status: int = 200) -> None:
        outer = self
        self.text, self.status = text, status

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = outer.text.encode()
                self.send_response(outer.status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _collector(window: RollingWindow, source: str | None) -> PhaseGpuCollector:
    ctx = ViewContext(node="node3", interval=1.0, window=window,
                          options=ExporterOptions(phase_source=source))
    return PhaseGpuCollector(ctx)


def _exposition(collector: PhaseGpuCollector) -> str:
    reg = CollectorRegistry()
    reg.register(collector)
    return generate_latest(reg).decode()


def test_node_without_the_log_joins_the_drivers_timeline_over_http():
    driver = _Driver()
    try:
        window = RollingWindow(max_age_s=1e12)
        window.add_gpu(gpu_rows())
        col = _collector(window, driver.url)
        assert _exposition(col) == ""  # nothing before the first step
        assert col.poll() == 1
        assert col.poll() == 0  # the same step is not counted twice
        text = _exposition(col)
    finally:
        driver.close()
    assert 'verlmon_phase_gpu_sm_active_seconds_total{gpu="1",phase="update_actor"} 1.8' in text
    assert 'verlmon_phase_gpu_seconds_total{gpu="0",phase="gen"} 6.0' in text
    assert 'verlmon_phase_gpu_samples_total{gpu="0",phase="update_actor"} 4.0' in text
    util = re.search(r'verlmon_phase_gpu_utilization_seconds_total\{gpu="0",phase="gen"\} (\S+)',
                     text)
    assert util and float(util.group(1)) == pytest.approx(5.7)


def test_unreachable_or_broken_driver_is_one_line_and_counts_nothing():
    broken = _Driver(text="<html>not metrics {</html>")
    try:
        with pytest.raises(PhaseSourceError, match="not Prometheus metrics"):
            fetch_step(broken.url)
    finally:
        broken.close()
    window = RollingWindow(max_age_s=1e12)
    window.add_gpu(gpu_rows())
    col = _collector(window, broken.url)  # closed now: connection refused
    with pytest.raises(PhaseSourceError, match="cannot read http://127.0.0.1"):
        col.poll()
    assert _exposition(col) == ""


def test_the_driver_uses_the_steps_of_its_own_log():
    window = RollingWindow(max_age_s=1e12)
    window.add_gpu(gpu_rows(node="node0"))
    col = _collector(window, None)
    assert col.poll() == 0  # no step yet
    window.add_steps([step_from_metrics(DRIVER)])
    assert col.poll() == 1
    assert 'verlmon_phase_gpu_seconds_total{gpu="1",phase="update_actor"} 4.0' in _exposition(col)
