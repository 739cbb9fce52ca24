"""Exposition: per-collector isolation, health series, and the fast text formatter."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client import exposition as pe
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
)
from prometheus_client.openmetrics.exposition import generate_latest as om_generate_latest

from exporters.collectors.nccl import NcclCollector
from exporters.exposition import EOF, Exposition, _Families, format_families
from exporters.options import ExporterOptions
from exporters.registry import BaseCollector, ExporterContext
from exporters.sampling import SampledCollector

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


def exposition(tmp_path) -> Exposition:
    shutil.copy(FIXTURE, tmp_path / FIXTURE.name)
    ctx = ExporterContext(node="n0", interval=1.0,
                          options=ExporterOptions(nccl_dir=str(tmp_path)))
    nccl = NcclCollector(ctx)
    nccl.sample_once()
    failing = FailingSampler(ctx)
    failing.sample_once()
    return Exposition({"nccl": nccl, "exploding": Exploding(ctx), "failing": failing,
                       "fine": Fine(ctx)}, node="n0", version="9.9", backend="sim")


def one_scrape(collector) -> dict:
    """Every sample of one collect() call, keyed by (name, sorted label items)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in collector.collect() for s in fam.samples}


def promtool(text: bytes) -> subprocess.CompletedProcess:
    return subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                          timeout=60)


@pytest.mark.slow
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
    """The store writer reports on itself; the exposition serves what registered (extra)."""
    from monitor.live import HealthRegistry
    from monitor.store import RunStore, StoreWriter

    writer = StoreWriter(RunStore(str(tmp_path / "run.sqlite")))
    writer.up, writer.write_errors = False, 3
    health = HealthRegistry()
    health.register(writer)
    exp = exposition(tmp_path)
    exp.extra = health.collect
    reg = CollectorRegistry()
    reg.register(exp)
    assert reg.get_sample_value("verlmon_store_up") == 0
    assert reg.get_sample_value("verlmon_store_write_errors_total") == 3


def test_fast_formatter_matches_prometheus_client():
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
    # OpenMetrics (what Prometheus asks for first): the bytes of prometheus_client's writer
    assert format_families(families, openmetrics=True) + EOF == \
        om_generate_latest(_Families(families))


def _ctx() -> ExporterContext:
    return ExporterContext(node="n0", interval=1.0, options=ExporterOptions())


class LongLabels(BaseCollector):
    name = "long_labels"

    def collect(self):
        fam = GaugeMetricFamily("verlmon_test_long", "long labels", labels=["log"])
        fam.add_metric(["/short/path.log"], 1)
        for tail in ("a", "b"):  # same 30 KB start, different ends: must stay two series
            fam.add_metric(["/runs/" + "x" * 30_000 + tail], 2)
        yield fam


def _truncated(exp: Exposition) -> float:
    reg = CollectorRegistry()
    reg.register(exp)
    return reg.get_sample_value("verlmon_label_values_truncated_total")


def test_long_label_values_are_shortened_distinct_and_counted():
    """Before (issue 20): a 31 KB label value was written whole, once per sample."""
    from exporters.exposition import MAX_LABEL_CHARS

    exp = Exposition({"long_labels": LongLabels(_ctx())}, node="n0", version="1")
    text = exp.render().decode()
    values = [line.split('"')[1] for line in text.splitlines()
              if line.startswith("verlmon_test_long")]
    assert values[0] == "/short/path.log"
    assert all(len(v) == MAX_LABEL_CHARS for v in values[1:])
    assert values[1] != values[2] and values[1].startswith("/runs/xxx") and "...#" in values[1]
    assert _truncated(exp) == 2
    exp.render()  # counted at every scrape; the cache never holds the 30 KB values
    assert _truncated(exp) == 4
    assert exp.labels.cache and all(len(str(v)) <= 1000 for key in exp.labels.cache
                                    for _, v in key)


def test_two_expositions_in_one_process_count_their_own_shortened_labels():
    """Before: the count was one module-wide number, so a second exporter (or any earlier
    writer in the process) reported the first one's shortened labels as its own."""
    first = Exposition({"long_labels": LongLabels(_ctx())}, node="n0", version="1")
    second = Exposition({}, node="n1", version="1")
    first.render()
    format_families(LongLabels(_ctx()).collect())  # a bare write counts for no exporter
    second.render()
    assert _truncated(first) == 2
    assert _truncated(second) == 0
    assert "verlmon_label_values_truncated_total 0.0" in second.render().decode()


@pytest.mark.parametrize("accept, openmetrics", [
    ("application/openmetrics-text;version=1.0.0;q=0.5,text/plain;version=0.0.4;q=0.3", True),
    ("application/openmetrics-text; q=0, text/plain", False),  # q=0: not acceptable
    ("application/openmetrics-text;q=0.2, text/plain;q=0.9", False),  # text preferred
    ("text/plain", False),
    (None, False),
])
def test_negotiate_respects_q_values(accept, openmetrics):
    from exporters.exposition import negotiate

    assert negotiate(accept)[0] is openmetrics


class EscapeLabels(BaseCollector):
    name = "escape_labels"

    def collect(self):
        fam = GaugeMetricFamily("verlmon_test_escape", "hostile labels", labels=["evidence"])
        fam.add_metric(["stuck at evil\x1b[2J\x1b]0;owned\x07 (x.py:1) \u202egnp.exe\u200b"], 1)
        yield fam


def test_label_values_reach_prometheus_with_escapes_shown_not_raw():
    """Issue 41 item 4 (round 5 A10): a py-spy frame's ESC[2J and OSC 0 and a right-to-left
    override were written raw into label values (Grafana, Alertmanager and Slack show them);
    they are backslash escapes now, and promtool still accepts the page."""
    exp = Exposition({"escape_labels": EscapeLabels(_ctx())}, node="n0", version="1")
    page = exp.render()
    text = page.decode()
    line = next(x for x in text.splitlines() if x.startswith("verlmon_test_escape"))
    assert not [c for c in line if c in "\x1b\x07\u202e\u200b"]
    assert "evil\\\\x1b[2J\\\\x1b]0;owned\\\\x07" in line  # the exposition doubles backslashes
    if shutil.which("promtool"):
        assert promtool(page).returncode == 0
