"""Rollout engines end to end: a real exporter process scraping a simulated vLLM server whose
KV cache is full and preempting opens a ``kv_cache_preemption`` warning with its series on
/metrics and in the store; a real Prometheus loads verl's written config beside our rules and
exporter job, and scrapes and evaluates both."""

from __future__ import annotations

import re
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from procs import RULES_DIR, start_prometheus, wait_until  # noqa: E402
from test_exporter_process import start, stop  # noqa: E402

from monitor.sim.engine_server import EngineServer, EngineState  # noqa: E402
from monitor.store import RunStore  # noqa: E402

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

#: Short bins so the test is quick; the shipped defaults (30 s bins, 60 s persistence, a
#: detector run every 30 s) open the warning within two minutes
#: (tests/test_detect_rollout_engine.py::test_live_runs_see_it_open_as_the_data_arrives).
FAST = {"kv_cache_preemption": {"bin_s": 2.0, "open_after_s": 4.0, "close_after_s": 4.0}}


class Working:
    """Lets the simulated engine's work accrue in the background while the test runs."""

    def __init__(self, *servers: EngineServer) -> None:
        self.servers = servers
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for srv in self.servers:
                srv.advance()

    def __enter__(self) -> Working:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def exporter_argv(tmp_path: Path, engine_url: str) -> list[str]:
    cfg = tmp_path / "fast.yaml"
    cfg.write_text(yaml.safe_dump(FAST))
    return ["--listen-address", "127.0.0.1:0", "--gpu-backend", "sim", "--scenario", "healthy",
            "--sim-gpus", "1", "--interval", "0.5", "--rollout-server", engine_url,
            "--rollout-interval", "0.5", "--detect-interval", "1", "--config", str(cfg),
            "--store", str(tmp_path / "run.db"), "--node", "n0"]


def preempting_vllm() -> EngineServer:
    # 0.5 preemptions a second (30 a minute): a warning (critical from 60 a minute)
    return EngineServer("vllm", state=EngineState(kv_cache_usage=0.99, running=64, waiting=30,
                                                  preemptions_per_s=0.5)).start()


def test_a_full_preempting_vllm_opens_a_kv_cache_preemption_warning(tmp_path: Path):
    engine = preempting_vllm()
    server = engine.address
    proc = None
    try:
        with Working(engine):
            t0 = time.monotonic()
            proc, url = start(exporter_argv(tmp_path, engine.url), tmp_path)

            def flag_line() -> str | None:
                text = httpx.get(url, timeout=5).text
                found = re.search(r'verlmon_flag_active\{[^}]*kind="kv_cache_preemption"[^}]*'
                                  r'\} 1\.0', text)
                return text if found else None

            text = wait_until(flag_line, timeout=120, interval=0.5,
                              what="the kv_cache_preemption flag on /metrics")
            assert time.monotonic() - t0 < 120
            flag = re.search(r'verlmon_flag_active\{([^}]*kind="kv_cache_preemption"[^}]*)\}',
                             text).group(1)
            assert 'severity="warning"' in flag
            assert re.search(r'verlmon_rollout_kv_cache_usage_ratio\{engine="vllm",model="[^"]+",'
                             rf'server="{re.escape(server)}"\}} 0\.99', text)
            assert re.search(rf'verlmon_rollout_server_up\{{server="{re.escape(server)}"\}} 1\.0',
                             text)
            assert re.search(r'verlmon_rollout_preemptions_total\{[^}]*\} [1-9]', text)
            assert 'verlmon_collector_success{collector="rollout_engine"} 1.0' in text
    finally:
        if proc is not None:
            assert stop(proc) == 0
        engine.stop()
    with RunStore(tmp_path / "run.db") as store:
        rows = store.rollout_frame()
        assert len(rows) > 0 and set(rows["server"]) == {server}
        assert (rows["kv_cache_usage"] == 0.99).all()
        flags = [f for f in store.flags() if f.kind == "kv_cache_preemption"]
        assert flags and "preemptions/min" in flags[0].evidence


def verl_written_config(addresses: list[str]) -> dict:
    """The config verl's update_prometheus_config writes (verl/workers/rollout/utils.py)."""
    return {
        "global": {"scrape_interval": "10s", "evaluation_interval": "10s"},
        "scrape_configs": [
            {"job_name": "ray",
             "file_sd_configs": [{"files": ["/tmp/ray/prom_metrics_service_discovery.json"]}]},
            {"job_name": "rollout", "static_configs": [{"targets": addresses}]},
        ],
    }


def test_prometheus_scrapes_verls_rollout_job_beside_our_rules_and_exporter(tmp_path: Path):
    engine = preempting_vllm()
    proc = None
    prom = None
    try:
        with Working(engine):
            # verl writes its file; the exporter discovers the servers from it
            verl_file = tmp_path / "ray" / "prometheus.yml"
            verl_file.parent.mkdir()
            with open(verl_file, "w") as f:
                yaml.dump(verl_written_config([engine.address]), f, default_flow_style=False,
                          indent=2)
            argv = exporter_argv(tmp_path, engine.url)
            i = argv.index("--rollout-server")
            argv[i:i + 2] = ["--rollout-discovery-file", str(verl_file)]
            proc, url = start(argv, tmp_path)
            exporter = url.removeprefix("http://").removesuffix("/metrics")
            # one Prometheus: verl's jobs as verl wrote them, plus our rules and exporter job
            cfg = verl_written_config([engine.address])
            cfg["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s",
                             "scrape_timeout": "1s"}
            cfg["rule_files"] = [str(RULES_DIR / "recording.yml"), str(RULES_DIR / "alerts.yml")]
            cfg["scrape_configs"].append({
                "job_name": "verl-monitor",
                "static_configs": [{"targets": [exporter], "labels": {"node": "n0"}}]})
            prom = start_prometheus(tmp_path / "prom", config_text=yaml.safe_dump(cfg))
            # the engine, scraped directly by verl's job, with vLLM's own names
            wait_until(lambda: prom.query('vllm:kv_cache_usage_perc{job="rollout"} > 0.9'),
                       timeout=60, what="verl's rollout job scraped")
            # the exporter's series of the same server, and our alert on its flag
            got = wait_until(lambda: prom.query(
                f'verlmon_rollout_kv_cache_usage_ratio{{job="verl-monitor",'
                f'server="{engine.address}"}}'), timeout=60, what="the exporter scraped")
            assert float(got[0]["value"][1]) == pytest.approx(0.99)
            # firing, its description the flag's own words from the exporter's verlmon_flag_info
            # (the server, its fill and rate) and the flag's advice, not the rule's fallback text
            alerts = wait_until(lambda: [
                a for a in prom.alerts()
                if a["labels"]["alertname"] == "VerlKvCachePreemption" and a["state"] == "firing"
                and "preemptions/min over" in a["annotations"]["description"]],
                timeout=120, what="VerlKvCachePreemption firing with the flag's words")
            assert alerts[0]["labels"]["node"] == "n0"
            text = alerts[0]["annotations"]["description"]
            assert re.match(rf"Rollout server {re.escape(engine.address)} \(vllm\): KV cache 99% "
                            r"full with \d+ preemptions/min over [\d.]+ min", text), text
            assert "\nAdvice:\n• " in text and "gpu_memory_utilization" in text
            assert "A rollout server's KV cache is full" not in text
    finally:
        if prom is not None:
            prom.stop()
        if proc is not None:
            stop(proc)
        engine.stop()
