"""Open and closed flags read back from a real Prometheus scraping a real FlagsCollector: a flag
is open on a page exactly while it is open in the exporter."""

from __future__ import annotations

import re
import subprocess
import time
from dataclasses import fields

import pandas as pd
import pytest
from e2e.procs import start_prometheus, wait_until
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from dashboards.sources.prometheus import PrometheusSource
from monitor import metric_names as m
from monitor.live import ViewContext
from monitor.live.flag_series import FlagsCollector
from monitor.live.flag_tracker import FlagTracker
from monitor.live.rolling_window import RollingWindow
from monitor.records import Flag

pytestmark = [
    pytest.mark.skipif(subprocess.run(["which", "prometheus"], capture_output=True).returncode
                       != 0, reason="prometheus binary not installed (make sysdeps)"),
    pytest.mark.slow,  # starts Prometheus (make test-fast skips it)
]

#: Scrape interval of the test's Prometheus (s): long enough that "a scrape or two late"
#: cannot pass for "at the first scrape".
SCRAPE_S = 3


def _context(tracker: FlagTracker) -> ViewContext:
    """The exporter context holding ``tracker`` (a field of its own, or ``extra`` before)."""
    if "tracker" in {f.name for f in fields(ViewContext)}:
        return ViewContext(node="node0", interval=1.0, tracker=tracker)
    return ViewContext(node="node0", interval=1.0, window=RollingWindow(),
                           extra={"flag_tracker": tracker})


@pytest.fixture(scope="module")
def exporter_and_prometheus(tmp_path_factory):
    """A FlagsCollector over a real FlagTracker served over HTTP, scraped by Prometheus."""
    tmp = tmp_path_factory.mktemp("promflags")
    tracker = FlagTracker()
    reg = CollectorRegistry()
    reg.register(FlagsCollector(_context(tracker)))
    Gauge(m.BUILD_INFO, "build", ["version"], registry=reg).labels("test").set(1)
    server, _thread = start_http_server(0, addr="127.0.0.1", registry=reg)
    target = f"127.0.0.1:{server.server_port}"
    prom = start_prometheus(tmp, timeout=90, scrape_targets=[target], job="verlmon",
                            node="node0", interval=f"{SCRAPE_S}s", rule_files=())
    src = PrometheusSource(prom.url)
    try:
        wait_until(lambda: src.time_range(), 90, what="the first scrape")
        yield tracker, src
    finally:
        src.close()
        prom.stop()
        server.shutdown()


def _scraped_after(src: PrometheusSource, t: float) -> float | None:
    """The newest scrape time when it is later than ``t``."""
    rng = src.time_range()
    return rng[1] if rng and rng[1] > t else None


def test_flag_opens_and_closes_at_the_first_scrape_after_it_does(exporter_and_prometheus):
    tracker, src = exporter_and_prometheus
    flag = Flag("gpu_imbalance", "warning", start=time.time(), end=None,
                scope={"node": "node0", "gpus": [3]}, evidence="GPU 3 at 40% vs 90%")
    opened_at = time.time()
    tracker.update([flag], now=opened_at)
    wait_until(lambda: _scraped_after(src, opened_at), 20, what="a scrape after the flag opened")
    # open from the first scrape that saw it, with the exporter's evidence
    now_open = src.flags(active_only=True)
    assert [(f.kind, f.scope.get("gpus")) for f in now_open] == [("gpu_imbalance", [3])]
    assert now_open[0].evidence == "GPU 3 at 40% vs 90%"
    # let it stay open a few scrapes, then the problem ends in the exporter
    time.sleep(2.5 * SCRAPE_S)
    assert len(src.flags(active_only=True)) == 1
    closed_at = time.time()
    tracker.update([], now=closed_at)
    scrape = wait_until(lambda: _scraped_after(src, closed_at), 20, what="a scrape after the flag closed")
    # closed at that first scrape: no page can show it open any more
    assert src.flags(active_only=True) == []
    history = [f for f in src.flags() if f.kind == "gpu_imbalance"]
    assert len(history) == 1 and history[0].end is not None
    assert opened_at - SCRAPE_S <= history[0].start < history[0].end <= scrape
    # a window ending before it closed still reads it open then
    earlier = src.flags(active_only=True, start=history[0].start - 60, end=closed_at - 1)
    assert [f.kind for f in earlier] == ["gpu_imbalance"]


@pytest.fixture(scope="module")
def alerting(tmp_path_factory):
    """A real Prometheus with GPUStraggler firing, NodeImbalance pending and exporter flags
    firing and held back (``tests/prom_alerts.py``)."""
    from prom_alerts import start_alerting_prometheus

    pair = start_alerting_prometheus(tmp_path_factory.mktemp("alerting"))
    src = PrometheusSource(pair.url)
    try:
        yield pair, src
    finally:
        src.close()
        pair.stop()


def test_open_flags_are_the_firing_alerts_under_their_names_from_when_they_fired(alerting):
    from prom_alerts import ADVICE, RUNBOOK, STRAGGLER_GPU

    pair, src = alerting
    end = time.time()
    flags = {f.kind: f for f in src.flags(True, end - 600, end)}
    # firing only: the pending NodeImbalance and the held-back low_utilization are not open
    assert set(flags) == {"GPUStraggler", "io_starvation", "util_overstates_sm"}
    straggler = flags["GPUStraggler"]
    assert straggler.scope == {"node": "node3", "gpus": [STRAGGLER_GPU]}
    assert straggler.evidence.startswith("Its SMs were busy")
    assert straggler.advice[0] == ADVICE and RUNBOOK in straggler.advice[-1]
    # one start everywhere: the moment the alert began to fire (activeAt + for: 2 s at 1 s
    # evaluations), the "since" Alertmanager sends to Slack
    (since,) = src.query('ALERTS_FOR_STATE{alertname="GPUStraggler"}')
    assert straggler.start == pytest.approx(float(since["value"][1]) + 2.0)
    # an exporter flag starts when its own alert began to fire (no for: its activeAt)
    (io_since,) = src.query('ALERTS_FOR_STATE{alertname="VerlIoStarvation"}')
    assert flags["io_starvation"].start == pytest.approx(float(io_since["value"][1]))


def test_pending_alerts_and_held_back_flags_are_shown_apart(alerting):
    _pair, src = alerting
    end = time.time()
    pending = {f.kind: why for f, why in src.pending_flags(end - 600, end)}
    assert set(pending) == {"NodeImbalance", "low_utilization"}
    assert pending["NodeImbalance"].startswith("pending")
    assert pending["low_utilization"].startswith("held back")
    # another job's view holds none of them
    other = PrometheusSource(src.url, job="another-job")
    try:
        assert other.pending_flags(end - 600, end) == [] and other.flags(True, end - 600,
                                                                        end) == []
    finally:
        other.close()


def test_phase_activity_comes_from_the_per_phase_counters(alerting):
    from prom_alerts import PHASES

    _pair, src = alerting
    end = time.time()
    act = src.phase_activity(end - 20, end).set_index("phase")
    # gen: 80% busy from the counters, whatever the scrape interval; adv: too few samples
    assert act.loc["gen", "util_mean"] == pytest.approx(100 * PHASES["gen"][1], abs=1.0)
    assert act.loc["gen", "withheld"] == ""
    assert act.loc["adv", "withheld"] != "" and pd.isna(act.loc["adv", "util_mean"])
    # the count it gives is under the minimum it names (never "3 samples (fewer than 3)")
    said, minimum = (float(x) for x in re.findall(r"\d+(?:\.\d+)?", act.loc["adv", "withheld"]))
    assert said < minimum and said == pytest.approx(act.loc["adv", "samples"], abs=0.01)


def test_jobs_lists_every_scrape_job(alerting):
    from prom_alerts import JOB

    assert alerting[1].jobs() == [JOB]
