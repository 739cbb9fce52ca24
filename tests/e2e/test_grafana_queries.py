"""Every Grafana panel query answers with data from a real Prometheus scraping real exporters.

Two ``verl-monitor exporter`` processes stand in for a two-node job (simulated GPUs):

- ``gpu-a`` plays ``gpu_fault`` into its own verl log (XID 94 and thermal throttling on a GPU)
  after a few agent-loop steps: the scenario runs server-mode rollout, so the exporter also
  scrapes the simulated vLLM servers it starts (the Rollout engines dashboard);
- ``gpu-b`` follows a breakdown-format verl log of a ``comm_heavy`` run (so the log's comm timer
  and rollout wait are there) and an NCCL Inspector dump directory that this test appends
  records to while it runs.

A real Prometheus scrapes both every second. Each panel query of the committed dashboards is
then run as Grafana would run it (``$__rate_interval`` -> 1m, ``$__range`` -> 5m), once with
every variable on "All" (``.+``) and once with the real values selected (Grafana's multi-value
regex form), and must neither error nor come back empty. The variable queries themselves must
list the job, both nodes and the GPUs.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import yaml
from procs import free_port, start_prometheus, wait_until

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "grafana" / "dashboards"
CLI = shutil.which("verl-monitor", path=str(Path(sys.executable).parent)) or "verl-monitor"
JOB = "verl-e2e"
NODES = ("gpu-a", "gpu-b")
GPUS = ("0", "1")
#: How long the test may wait for every query to have data (the exporters need ~30-50 s).
DATA_DEADLINE_S = 100


def _start_exporter(argv: list[str], workdir: Path, name: str) -> subprocess.Popen:
    workdir.mkdir(parents=True, exist_ok=True)
    with (workdir / f"{name}.log").open("wb") as log:
        return subprocess.Popen([CLI, "exporter", *argv], cwd=workdir, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def _nccl_writer(path: Path, stop: threading.Event) -> None:
    """Append NCCL Inspector records (two collectives, 0.12 s each) every half second."""
    sn = 0
    while not stop.is_set():
        now_us = int(time.time() * 1e6)
        lines = []
        for coll, size in (("AllReduce", 1 << 27), ("AllGather", 1 << 26)):
            sn += 1
            lines.append(json.dumps({
                "header": {"id": "0x7f00e2e", "comm_name": "DP Group 0", "rank": 0,
                           "n_ranks": 2, "nnodes": 2},
                "metadata": {"inspector_output_format_version": "v4.2",
                             "dump_timestamp_us": now_us, "hostname": "gpu-b", "pid": 4242},
                "coll_perf": {"coll": coll, "coll_sn": sn, "coll_msg_size_bytes": size,
                              "coll_exec_time_us": 120000, "coll_timing_source": "kernel_gpu",
                              "coll_algobw_gbs": 180.0, "coll_busbw_gbs": 180.0},
            }))
        with path.open("a") as fh:
            fh.write("\n".join(lines) + "\n")
        stop.wait(0.5)


def _panel_queries() -> list[tuple[str, str, str, bool]]:
    """(dashboard uid, panel title, expr, instant) for every query of every panel."""
    out = []
    for path in sorted(DASHBOARDS.glob("*.json")):
        board = json.loads(path.read_text())
        for panel in board["panels"]:
            for target in panel.get("targets", []):
                out.append((board["uid"], panel["title"], target["expr"],
                            bool(target.get("instant"))))
    return out


def _variable_queries() -> dict[str, str]:
    board = json.loads((DASHBOARDS / "verlmon-overview.json").read_text())
    return {v["name"]: v["query"] for v in board["templating"]["list"] if v["type"] == "query"}


def _substitute(expr: str, values: dict[str, str]) -> str:
    """Replace Grafana's variables the way Grafana would before sending the query."""
    expr = expr.replace("$__rate_interval", "1m").replace("$__range", "5m")
    for name, value in values.items():
        expr = expr.replace(f"${name}", value)
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


ALL = {"job": ".+", "node": ".+", "gpu": ".+"}
REAL = {"job": JOB, "node": "(" + "|".join(NODES) + ")", "gpu": "(" + "|".join(GPUS) + ")"}


class Api:
    """Just enough of Grafana's Prometheus data source: range, instant and series queries."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.client = httpx.Client(timeout=10)

    def run(self, expr: str, instant: bool, since: float | None = None
            ) -> tuple[str | None, list[dict]]:
        """(error or None, result) of a panel query over the last 90 s (or from ``since``)."""
        now = time.time()
        if instant:
            resp = self.client.get(f"{self.url}/api/v1/query", params={"query": expr,
                                                                       "time": now})
        else:
            resp = self.client.get(f"{self.url}/api/v1/query_range",
                                   params={"query": expr, "start": since or now - 90, "end": now,
                                           "step": 2})
        body = resp.json()
        if body.get("status") != "success":
            return f"{body.get('errorType')}: {body.get('error')}", []
        return None, body["data"]["result"]

    def label_values(self, query: str) -> list[str]:
        """Evaluate a ``label_values(selector, label)`` variable query."""
        m = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
        assert m, query
        selector, label = m.groups()
        resp = self.client.get(f"{self.url}/api/v1/series",
                               params={"match[]": selector, "start": time.time() - 300})
        body = resp.json()
        assert body["status"] == "success", body
        return sorted({s[label] for s in body["data"] if label in s})


#: Metrics the simulated GPU backend does not export (yet): a query on one of them may be
#: empty, but only while no exporter serves the metric at all (checked on every poll).
NOT_SIMULATED = (
    "verlmon_gpu_nvlink_transmit_bytes_per_second",
    "verlmon_gpu_nvlink_receive_bytes_per_second",
    "verlmon_gpu_pcie_transmit_bytes_per_second",
    "verlmon_gpu_pcie_receive_bytes_per_second",
    # only while a job hangs and an exporter's dump round named a rank (monitor/hang)
    "verlmon_hang_culprit_info",
    # likewise: where each of the job's processes is, only while a dump round of a silence ran
    "verlmon_hang_where_info",
    # memory growth: deriv over 10 minutes needs two samples of a series inside the window,
    # and the time to full is only kept while some GPU's memory grows
    "instance_gpu:verlmon_gpu_memory_used_bytes:deriv10m",
    "instance_gpu:verlmon_gpu_memory_used_bytes:seconds_to_full",
)


def _failures(api: Api, values: dict[str, str]) -> list[str]:
    bad = []
    absent = {m for m in NOT_SIMULATED if not api.run(f"count({m})", instant=True)[1]}
    for uid, title, expr, instant in _panel_queries():
        err, result = api.run(_substitute(expr, values), instant)
        if err:
            bad.append(f"{uid} / {title}: ERROR {err} in {expr}")
        elif not result and not any(m in expr for m in absent):
            bad.append(f"{uid} / {title}: no data for {expr}")
    return bad


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    work = tmp_path_factory.mktemp("grafana-e2e")
    sim = subprocess.run([CLI, "simulate", "--scenario", "comm_heavy:20", "--steps", "20",
                          "--log-format", "breakdown", "--out", str(work / "sim")],
                         capture_output=True, text=True, timeout=60)
    assert sim.returncode == 0, sim.stderr
    nccl_dir = work / "nccl"
    nccl_dir.mkdir()
    ports = {node: free_port() for node in NODES}
    common = ["--interval", "1", "--gpu-backend", "sim", "--sim-gpus", "2",
              "--detect-interval", "2"]
    procs = [
        _start_exporter([*common, "--listen-address", f"127.0.0.1:{ports['gpu-a']}",
                         "--node", "gpu-a", "--scenario", "agent_loop:4,gpu_fault:56",
                         "--sim-log", str(work / "a" / "train.log"), "--sim-speed", "30",
                         "--rollout-interval", "1"],
                        work / "a", "exporter"),
        _start_exporter([*common, "--listen-address", f"127.0.0.1:{ports['gpu-b']}",
                         "--node", "gpu-b", "--scenario", "gpu_imbalance:60",
                         "--log", str(work / "sim" / "train.log"), "--nccl-dir", str(nccl_dir)],
                        work / "b", "exporter"),
    ]
    stop = threading.Event()
    writer = threading.Thread(target=_nccl_writer, args=(nccl_dir / "gpu-b-pid4242.log", stop),
                              daemon=True)
    writer.start()
    config = yaml.safe_dump({
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s",
                   "scrape_timeout": "1s"},
        "scrape_configs": [{
            "job_name": JOB,
            "static_configs": [{"targets": [f"127.0.0.1:{ports[n]}"], "labels": {"node": n}}
                               for n in NODES],
        }],
    })
    server = None
    try:
        for node, proc in zip(NODES, procs, strict=True):
            wait_until(lambda p=ports[node]: httpx.get(f"http://127.0.0.1:{p}/metrics",
                                                       timeout=2).status_code == 200,
                       timeout=60, what=f"exporter {node}")
            assert proc.poll() is None, f"exporter {node} exited with status {proc.returncode}"
        started = time.time()
        server = start_prometheus(work / "prom", config_text=config)
        server.started = started
        yield server
    finally:
        stop.set()
        if server is not None:
            server.stop()
        for proc in procs:
            _stop(proc)
        writer.join(timeout=5)


def test_every_panel_query_returns_data_for_all_and_for_selected_values(prom):
    api = Api(prom.url)
    wait_until(lambda: len(prom.query(f'up{{job="{JOB}"}} == 1')) == len(NODES), timeout=30,
               what="both exporters scraped")
    failures: list[str] = []

    def all_answer() -> bool:
        nonlocal failures
        failures = _failures(api, ALL) + _failures(api, REAL)
        return not failures

    try:
        wait_until(all_answer, timeout=DATA_DEADLINE_S, interval=3,
                   what="data for every panel query")
    except TimeoutError:
        pass
    assert not failures, "\n".join(failures)
    assert len(_panel_queries()) >= 40


def test_variable_queries_list_the_job_nodes_and_gpus(prom):
    api = Api(prom.url)
    queries = _variable_queries()
    jobs = wait_until(lambda: api.label_values(queries["job"]), timeout=30, what="jobs")
    assert jobs == [JOB]
    # every node's first scrape lands on its own schedule (later on a busy machine): wait for
    # them, then the lists must be exactly the job's
    node_query = _substitute(queries["node"], {"job": JOB})
    wait_until(lambda: len(api.label_values(node_query)) >= len(NODES), timeout=30,
               what="every node scraped")
    assert api.label_values(node_query) == list(NODES)
    gpu_query = _substitute(queries["gpu"], {"job": JOB, "node": "gpu-a"})
    wait_until(lambda: len(api.label_values(gpu_query)) >= len(GPUS), timeout=30,
               what="every GPU of gpu-a")
    assert api.label_values(gpu_query) == list(GPUS)


def _instant(api: Api, uid: str, title: str) -> list[dict]:
    (expr,) = [e for u, t, e, _ in _panel_queries() if u == uid and t == title]
    err, result = api.run(_substitute(expr, ALL), instant=True)
    assert err is None, err
    return result


def test_panels_show_what_the_simulated_job_did(prom):
    """The numbers a user reads: the flag is listed, the XIDs counted, no GPU down."""
    api = Api(prom.url)
    flags = wait_until(lambda: _instant(api, "verlmon-overview", "Open flags with evidence"),
                       timeout=60,
                       what="an open flag")
    kinds = {(row["metric"]["node"], row["metric"]["kind"]) for row in flags}
    assert ("gpu-b", "comm_heavy") in kinds
    # the table carries the detector's evidence and advice, not only the labels
    (comm,) = [row["metric"] for row in flags if row["metric"]["kind"] == "comm_heavy"]
    assert comm.get("evidence") and "actor_rollout_ref" in comm.get("advice", "")
    xids = wait_until(lambda: _instant(api, "verlmon-gpus", "XID errors in range"),
                      timeout=30, what="XID count")
    assert float(xids[0]["value"][1]) > 0
    down = _instant(api, "verlmon-cluster", "GPUs down")
    assert {row["metric"]["node"]: float(row["value"][1]) for row in down} == {
        "gpu-a": 0.0, "gpu-b": 0.0}
    # a time-series panel: the throttling shows over the job's time range (it is active only
    # while the faulty GPU is busy, so an instant at the end of the sim may miss it)
    (expr,) = [e for u, t, e, _ in _panel_queries()
               if u == "verlmon-gpus" and t == "Clock-event reasons active"]
    err, throttled = api.run(_substitute(expr, ALL), instant=False, since=prom.started)
    assert err is None, err
    assert any(row["metric"]["node"] == "gpu-a" and "thermal" in row["metric"]["reason"]
               for row in throttled)
