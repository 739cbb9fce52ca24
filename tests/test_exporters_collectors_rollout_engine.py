"""The rollout-engine collector against real HTTP servers on 127.0.0.1 that serve vLLM's and
SGLang's exposition text (names, types, labels as in their sources), servers that are down,
slow or answer garbage, and discovery from the Prometheus config verl writes."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporters.collectors.rollout_engine import (
    RolloutEngineCollector,
    ScrapeError,
    metrics_url,
    parse_exposition,
    read_discovery_file,
    server_label,
)
from exporters.options import ExporterOptions
from exporters.registry import ExporterContext, load_all
from monitor import metric_names as m
from monitor.sim.engine_server import EngineServer, EngineState

MODEL = "Qwen/Qwen2.5-7B-Instruct"

#: A vLLM 0.11 /metrics answer as prometheus-client writes it (abridged: the process and
#: Python families, ``_created`` samples and one histogram's buckets, which the collector
#: must skip, are kept).
VLLM_TEXT = """\
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 48.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen2.5-7B-Instruct"} 44.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 7.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen2.5-7B-Instruct"} 3.0
# HELP vllm:num_requests_waiting_by_reason Number of requests waiting, by reason.
# TYPE vllm:num_requests_waiting_by_reason gauge
vllm:num_requests_waiting_by_reason{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct",reason="capacity"} 7.0
# HELP vllm:engine_sleep_state Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep level 2.
# TYPE vllm:engine_sleep_state gauge
vllm:engine_sleep_state{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct",sleep_state="awake"} 1.0
vllm:engine_sleep_state{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct",sleep_state="weights_offloaded"} 0.0
vllm:engine_sleep_state{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct",sleep_state="discard_all"} 0.0
vllm:engine_sleep_state{engine="1",model_name="Qwen/Qwen2.5-7B-Instruct",sleep_state="awake"} 1.0
vllm:engine_sleep_state{engine="1",model_name="Qwen/Qwen2.5-7B-Instruct",sleep_state="weights_offloaded"} 0.0
vllm:engine_sleep_state{engine="1",model_name="Qwen/Qwen2.5-7B-Instruct",sleep_state="discard_all"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 0.97
vllm:kv_cache_usage_perc{engine="1",model_name="Qwen/Qwen2.5-7B-Instruct"} 0.91
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 120.0
vllm:num_preemptions_total{engine="1",model_name="Qwen/Qwen2.5-7B-Instruct"} 30.0
# HELP vllm:num_preemptions_created Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_created gauge
vllm:num_preemptions_created{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 1.76e+09
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 1.5e+06
vllm:generation_tokens_total{engine="1",model_name="Qwen/Qwen2.5-7B-Instruct"} 500000.0
# HELP vllm:request_queue_time_seconds Histogram of time spent in WAITING phase for request.
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{engine="0",le="0.3",model_name="Qwen/Qwen2.5-7B-Instruct"} 10.0
vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf",model_name="Qwen/Qwen2.5-7B-Instruct"} 40.0
vllm:request_queue_time_seconds_count{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 40.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 20.0
vllm:request_queue_time_seconds_bucket{engine="1",le="+Inf",model_name="Qwen/Qwen2.5-7B-Instruct"} 60.0
vllm:request_queue_time_seconds_count{engine="1",model_name="Qwen/Qwen2.5-7B-Instruct"} 60.0
vllm:request_queue_time_seconds_sum{engine="1",model_name="Qwen/Qwen2.5-7B-Instruct"} 30.0
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_count{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 100.0
vllm:e2e_request_latency_seconds_sum{engine="0",model_name="Qwen/Qwen2.5-7B-Instruct"} 900.0
"""


class ListSink:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add_rollout(self, rows):
        self.rows.extend(rows)


def collector(servers=(), discovery: str | None = None, timeout: float = 2.0
              ) -> tuple[RolloutEngineCollector, ListSink]:
    sink = ListSink()
    opts = ExporterOptions(rollout_server=tuple(servers), rollout_discovery_file=discovery,
                           rollout_timeout=timeout)
    return RolloutEngineCollector(ExporterContext(node="n0", interval=1.0, sink=sink,
                                                  options=opts)), sink


def exposed(col: RolloutEngineCollector) -> dict[tuple[str, tuple], float]:
    """(sample name, sorted labels) -> value of what the collector exports."""
    reg = CollectorRegistry()
    reg.register(col)
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture
def servers():
    started: list[EngineServer] = []

    def make(engine: str = "vllm", **kw) -> EngineServer:
        srv = EngineServer(engine, **kw).start()
        started.append(srv)
        return srv

    yield make
    for srv in started:
        srv.stop()


def test_the_collector_registers_itself_and_addresses_become_urls_and_labels():
    assert "rollout_engine" in load_all()
    assert metrics_url("10.0.0.5:8000") == "http://10.0.0.5:8000/metrics"
    assert metrics_url("http://10.0.0.5:8000") == "http://10.0.0.5:8000/metrics"
    assert metrics_url("https://h:1/custom") == "https://h:1/custom"
    assert server_label("http://10.0.0.5:8000/metrics") == "10.0.0.5:8000"


def test_vllm_text_as_its_source_writes_it_sums_requests_and_takes_the_fullest_cache():
    r = parse_exposition(VLLM_TEXT)
    assert (r.engine, r.model) == ("vllm", MODEL)
    assert r.get("kv_cache_usage") == 0.97  # the fullest engine core
    assert r.get("running") == 92 and r.get("waiting") == 10  # not the by-reason family
    assert r.get("preemptions_total") == 150 and r.get("generation_tokens_total") == 2e6
    assert (r.get("queue_time_sum"), r.get("queue_time_count")) == (50.0, 100.0)
    assert r.sleeping == 0.0 and math.isnan(r.get("paused"))


def test_old_vllm_reports_the_deprecated_cache_gauge_and_no_sleep_state():
    old = VLLM_TEXT.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    old = "\n".join(ln for ln in old.splitlines() if "engine_sleep_state" not in ln)
    r = parse_exposition(old)
    assert r.get("kv_cache_usage") == 0.97 and math.isnan(r.sleeping)


def test_a_sleeping_engine_and_garbage_are_told_apart():
    asleep = VLLM_TEXT.replace('sleep_state="awake"} 1.0', 'sleep_state="awake"} 0.0')
    assert parse_exposition(asleep).sleeping == 1.0
    for text in ("", "<html>502</html>", "# HELP up x\n# TYPE up gauge\nup 1\n",
                 "vllm:num_requests_running{engine=\"0\" 3\n"):
        with pytest.raises(ScrapeError) as info:
            parse_exposition(text)
        assert info.value.reason == "garbage"


def test_vllm_and_sglang_servers_become_rows_and_verlmon_series(servers):
    vllm = servers("vllm", engines=2, state=EngineState(kv_cache_usage=0.98, running=40,
                                                        waiting=12, preemptions_per_s=2.0,
                                                        queue_time_s=0.5))
    sglang = servers("sglang", state=EngineState(kv_cache_usage=0.5, running=20, paused=4,
                                                 preemptions_per_s=1.0))
    col, sink = collector([vllm.url, sglang.address])
    assert col.sample_once(), col.last_error
    vllm.advance(10.0)
    sglang.advance(10.0)
    assert col.sample_once(), col.last_error
    by = {(r["server"], r["ts"]): r for r in sink.rows}
    assert len(by) == 4 and {r["node"] for r in sink.rows} == {"n0"}
    last = {r["engine"]: r for r in sink.rows[-2:]}
    v, s = last["vllm"], last["sglang"]
    assert v["server"] == vllm.address and v["model"] == MODEL
    assert (v["kv_cache_usage"], v["running"], v["waiting"]) == (0.98, 40, 12)
    assert v["preemptions_total"] == pytest.approx(20.0)  # 2/s for 10 s over two engine cores
    assert v["queue_time_mean_s"] == pytest.approx(0.5) and v["sleeping"] == 0.0
    assert math.isnan(v["paused"])
    assert (s["kv_cache_usage"], s["paused"], s["preemptions_total"]) == (0.5, 4, 10.0)
    assert math.isnan(s["sleeping"])  # SGLang does not say
    got = exposed(col)
    lab = (("engine", "vllm"), ("model", MODEL), ("server", vllm.address))
    assert got[(m.ROLLOUT_KV_CACHE, lab)] == 0.98
    assert got[(m.ROLLOUT_REQUESTS, tuple(sorted((*lab, ("state", "waiting")))))] == 12
    assert got[(m.ROLLOUT_PREEMPTIONS, lab)] == pytest.approx(20.0)
    assert got[(m.ROLLOUT_QUEUE_TIME + "_count", lab)] == pytest.approx(20.0)
    assert got[(m.ROLLOUT_SLEEPING, lab)] == 0.0
    slab = (("engine", "sglang"), ("model", MODEL), ("server", sglang.address))
    assert got[(m.ROLLOUT_REQUESTS, tuple(sorted((*slab, ("state", "paused")))))] == 4
    assert (m.ROLLOUT_SLEEPING, slab) not in got
    assert got[(m.ROLLOUT_SERVER_UP, (("server", vllm.address),))] == 1.0
    names = {name for name, _ in got}
    assert names <= {m.ROLLOUT_KV_CACHE, m.ROLLOUT_REQUESTS, m.ROLLOUT_PREEMPTIONS,
                     m.ROLLOUT_GEN_TOKENS, m.ROLLOUT_QUEUE_TIME + "_sum",
                     m.ROLLOUT_QUEUE_TIME + "_count", m.ROLLOUT_E2E_LATENCY + "_sum",
                     m.ROLLOUT_E2E_LATENCY + "_count", m.ROLLOUT_SLEEPING,
                     m.ROLLOUT_SERVER_UP, m.ROLLOUT_SCRAPE_DURATION, m.ROLLOUT_SCRAPE_ERRORS}
    col.close()


@pytest.mark.slow
def test_down_slow_and_garbage_servers_are_health_lines_not_a_stalled_collector(servers):
    good = servers("vllm")
    slow = servers("vllm")
    slow.set_mode("slow", delay_s=5.0)
    garbage = servers("sglang")
    garbage.set_mode("garbage")
    broken = servers("vllm")
    broken.set_mode("error")
    down = servers("vllm")
    down_address = down.address
    down.stop()
    col, sink = collector([good.url, slow.url, garbage.url, broken.url, down_address],
                          timeout=0.5)
    assert col.sample_once() and col.healthy()
    assert [r["server"] for r in sink.rows] == [good.address]  # the others cost no row
    got = exposed(col)

    def errors(srv: str, reason: str) -> float:
        return got[(m.ROLLOUT_SCRAPE_ERRORS, (("reason", reason), ("server", srv)))]

    assert errors(slow.address, "timeout") == 1
    assert errors(garbage.address, "garbage") == 1
    assert errors(broken.address, "http") == 1
    assert errors(down_address, "connect") == 1
    ups = {labels[0][1]: v for (name, labels), v in got.items() if name == m.ROLLOUT_SERVER_UP}
    assert ups == {good.address: 1.0, slow.address: 0.0, garbage.address: 0.0,
                   broken.address: 0.0, down_address: 0.0}
    # given up at the deadline, not after the server's 5 s
    assert 0.5 <= got[(m.ROLLOUT_SCRAPE_DURATION, (("server", slow.address),))] < 5.0
    # the server that answers again is up on the next scrape
    garbage.set_mode("ok")
    assert col.sample_once()
    assert exposed(col)[(m.ROLLOUT_SERVER_UP, (("server", garbage.address),))] == 1.0
    col.close()


def write_like_verl(path: Path, addresses: list[str]) -> None:
    """What verl's update_prometheus_config (verl/workers/rollout/utils.py) writes."""
    config = {
        "global": {"scrape_interval": "10s", "evaluation_interval": "10s"},
        "scrape_configs": [
            {"job_name": "ray",
             "file_sd_configs": [{"files": ["/tmp/ray/prom_metrics_service_discovery.json"]}]},
            {"job_name": "rollout", "static_configs": [{"targets": addresses}]},
        ],
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        yaml.dump(config, f, default_flow_style=False, indent=2)


def test_servers_are_discovered_from_the_config_verl_writes_and_follow_its_changes(
        tmp_path, servers):
    a, b = servers("vllm"), servers("sglang")
    path = tmp_path / "session_latest" / "metrics" / "prometheus" / "prometheus.yml"
    col, sink = collector(discovery=str(path))
    assert col.sample_once() and col.healthy() and sink.rows == []  # not written yet: waits
    write_like_verl(path, [a.address])
    assert read_discovery_file(str(path)) == [a.address]
    assert col.sample_once()
    assert {r["server"] for r in sink.rows} == {a.address}
    write_like_verl(path, [b.address])  # a restarted rollout: new servers
    os.utime(path, (time.time() + 5, time.time() + 5))
    sink.rows.clear()
    assert col.sample_once()
    assert {r["server"] for r in sink.rows} == {b.address}
    assert set(col.servers) == {b.address}  # the old server's series are gone
    # a file that is not YAML keeps the servers read before and says so
    path.write_text("scrape_configs: [unclosed\n")
    os.utime(path, (time.time() + 10, time.time() + 10))
    sink.rows.clear()
    assert col.sample_once()
    assert not col.healthy() and "not YAML" in col.discovery_error
    assert {r["server"] for r in sink.rows} == {b.address}
    col.close()


def test_explicit_and_discovered_servers_are_scraped_once_each(tmp_path, servers):
    a = servers("vllm")
    path = tmp_path / "prometheus.yml"
    write_like_verl(path, [a.address])
    col, sink = collector([a.url], discovery=str(path))
    assert col.targets() == [a.url]
    assert col.sample_once() and len(sink.rows) == 1
    col.close()


def test_no_targets_costs_nothing_and_exports_nothing():
    col, sink = collector()
    assert col.sample_once() and sink.rows == [] and list(col.collect()) == []


@pytest.mark.slow
def test_its_own_thread_keeps_scraping_until_stopped(servers):
    srv = servers("vllm")
    col, sink = collector([srv.url])
    col.ctx.interval = 0.1
    col.start()
    try:
        deadline = time.monotonic() + 30
        while len(sink.rows) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        col.stop()
    assert len(sink.rows) >= 3 and col.errors == 0 and col.healthy()
    seen = len(sink.rows)
    time.sleep(0.3)
    assert len(sink.rows) == seen  # stopped


def test_a_port_that_does_not_speak_http_is_garbage_said_in_one_line(caplog):
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(5)

    def answer() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            conn.recv(1000)
            conn.sendall(b"SSH-2.0-OpenSSH_9.0\r\nnot http\r\n\r\n")
            conn.close()

    threading.Thread(target=answer, daemon=True).start()
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    col, sink = collector([address])
    with caplog.at_level("WARNING", logger="verl_monitor.exporter"):
        assert col.sample_once()
    listener.close()
    assert col.servers[address].errors == {"garbage": 1} and sink.rows == []
    lines = [r.getMessage() for r in caplog.records if address in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0] and "garbage" in lines[0]
    col.close()
