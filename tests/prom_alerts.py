"""A real Prometheus holding a firing and a pending alert, for the dashboard and source tests.

Test scaffolding (kept out of the shipped package): one stand-in exporter (``prometheus_client``
over HTTP on 127.0.0.1) publishes what a node without the log publishes -- GPU gauges, the
per-phase counters rising like a 2 s step of a long ``gen`` and a short ``adv``, the step
gauges, and exporter flags -- and a real Prometheus scrapes it every second and evaluates the
rules of :data:`RULES`:

- ``GPUStraggler`` fires for GPU 1 (``for: 2s``), with its advice and an absolute runbook link;
- ``NodeImbalance`` stays pending (``for: 1h``);
- the ``low_utilization`` flag is held back by its rule while the straggler fires;
- the ``io_starvation`` flag fires; ``util_overstates_sm`` (a consequence of the straggler)
  opens once the straggler fires, so it is the newest open flag.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from e2e.procs import PrometheusProc, start_prometheus, wait_until
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from dashboards.sources.prometheus import PrometheusSource
from monitor import metric_names as m

JOB = "straggler-job"
NODE = "node3"
GPUS = 4
STRAGGLER_GPU = 1
#: the per-phase counters: phase -> (share of each second, GPU utilization 0..1 in it)
PHASES = {"gen": (0.99, 0.8), "adv": (0.01, 0.3)}
RUNBOOK = "http://runbooks.example/verl-monitor/docs/runbooks.md#gpustraggler"
ADVICE = "Turn on trainer.balance_batch=True so each data-parallel rank gets a similar token count."
RULES = {"groups": [{"name": "verlmon.test", "rules": [
    {"alert": "GPUStraggler", "expr": f'{m.GPU_SM_ACTIVE}{{gpu="{STRAGGLER_GPU}"}} > 0.5',
     "for": "2s", "labels": {"severity": "warning", "kind": "gpu_imbalance"},
     "annotations": {
         "summary": "GPU {{ $labels.gpu }} on {{ $labels.node }} is the straggler",
         "description": "Its SMs were busy {{ $value | humanizePercentage }} of the last "
                        "minute while the other GPUs wait for it.\n"
                        f"Advice: {ADVICE}\nRunbook: {RUNBOOK}",
         "runbook_url": RUNBOOK}},
    {"alert": "NodeImbalance", "expr": f"count by (job, node) ({m.GPU_SM_ACTIVE}) > 0",
     "for": "1h", "labels": {"severity": "warning", "kind": "gpu_imbalance"}},
    {"alert": "VerlLowUtilization",
     "expr": 'verlmon_flag_active{kind="low_utilization"} == 1 unless on (job) '
             'ALERTS{alertname="GPUStraggler", alertstate="firing"}'},
    {"alert": "VerlIoStarvation", "expr": 'verlmon_flag_active{kind="io_starvation"} == 1'},
    {"alert": "VerlUtilOverstatesSm",
     "expr": 'verlmon_flag_active{kind="util_overstates_sm"} == 1'},
]}]}


@dataclass
class AlertingPrometheus:
    """The running pair: ``prom.url``, the stand-in exporter's address, and its gauges."""

    prom: PrometheusProc
    target: str
    flags: Gauge
    stop_event: threading.Event = field(default_factory=threading.Event)
    servers: list = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.prom.url

    def stop(self) -> None:
        self.stop_event.set()
        self.prom.stop()
        for server in self.servers:
            server.shutdown()


class _WholeTicks(CollectorRegistry):
    """A registry a scrape reads between two ticks, never in the middle of one: a scrape that
    saw a phase's utilization-seconds risen and not yet its samples read 84% for 80% busy."""

    def __init__(self) -> None:
        super().__init__()
        self.tick = threading.Lock()

    def collect(self):  # noqa: ANN201 - prometheus_client's generator
        with self.tick:
            metrics = list(super().collect())
        yield from metrics


def _registry() -> tuple[_WholeTicks, dict]:
    reg = _WholeTicks()
    g = {
        "build": Gauge(m.BUILD_INFO, "build", ["version"], registry=reg),
        "util": Gauge(m.GPU_UTIL, "util", ["gpu"], registry=reg),
        "sm": Gauge(m.GPU_SM_ACTIVE, "sm", ["gpu"], registry=reg),
        "mem": Gauge(m.GPU_MEM_USED, "mem", ["gpu"], registry=reg),
        "memtot": Gauge(m.GPU_MEM_TOTAL, "mem total", ["gpu"], registry=reg),
        "step": Gauge(m.TRAIN_STEP, "step", registry=reg),
        "step_ts": Gauge(m.LAST_STEP_TS, "last step", registry=reg),
        "step_s": Gauge(m.STEP_DURATION, "step seconds", registry=reg),
        "phase_s": Gauge(m.PHASE_DURATION, "phase seconds", ["phase"], registry=reg),
        "flags": Gauge(m.FLAG_ACTIVE, "flags", ["kind", "severity", "node", "gpu", "phase"],
                       registry=reg),
    }
    for name, key in ((m.PHASE_GPU_SECONDS, "p_sec"), (m.PHASE_GPU_UTIL_SECONDS, "p_util"),
                      (m.PHASE_GPU_SM_ACTIVE_SECONDS, "p_sm"), (m.PHASE_GPU_SAMPLES, "p_n")):
        g[key] = Counter(name.removesuffix("_total"), key, ["phase", "gpu"], registry=reg)
    g["build"].labels("test").set(1)
    for gpu in range(GPUS):
        busy = 0.95 if gpu == STRAGGLER_GPU else 0.4
        g["util"].labels(str(gpu)).set(0.9)
        g["sm"].labels(str(gpu)).set(busy)
        g["mem"].labels(str(gpu)).set(40e9)
        g["memtot"].labels(str(gpu)).set(80e9)
    return reg, g


def _tick(reg: _WholeTicks, g: dict, stop: threading.Event, step_s: float = 2.0) -> None:
    """Every 0.5 s the counters rise by what the exporter's 1 s samples would add (all of
    them at once, as a scrape sees them); every ``step_s`` a step ends."""
    step, last = 0, time.time()
    while not stop.wait(0.5):
        with reg.tick:
            _rise(g)
        now = time.time()
        if now - last >= step_s:
            step += 1
            with reg.tick:
                g["step"].set(step)
                g["step_ts"].set(now)
                g["step_s"].set(now - last)
                for phase, (share, _util) in PHASES.items():
                    g["phase_s"].labels(phase).set(share * (now - last))
            last = now


def _rise(g: dict) -> None:
    """One half second of the per-phase counters."""
    for phase, (share, util) in PHASES.items():
        for gpu in range(GPUS):
            c = (phase, str(gpu))
            g["p_sec"].labels(*c).inc(0.5 * share)
            g["p_util"].labels(*c).inc(0.5 * share * util)
            g["p_sm"].labels(*c).inc(0.5 * share * util / 2)
            g["p_n"].labels(*c).inc(0.5 * share)


def start_alerting_prometheus(workdir: Path, timeout: float = 90) -> AlertingPrometheus:
    """Start the stand-in exporter and a Prometheus over it; return once GPUStraggler fires,
    NodeImbalance is pending and the consequence flag (``util_overstates_sm``) has opened."""
    reg, g = _registry()
    stop = threading.Event()
    server, _thread = start_http_server(0, addr="127.0.0.1", registry=reg)
    threading.Thread(target=_tick, args=(reg, g, stop), daemon=True).start()
    flags = g["flags"]
    flags.labels("low_utilization", "warning", NODE, "2", "").set(1)
    flags.labels("io_starvation", "warning", NODE, "", "").set(1)
    rules = workdir / "rules.yml"
    workdir.mkdir(parents=True, exist_ok=True)
    rules.write_text(yaml.safe_dump(RULES, sort_keys=False))
    target = f"127.0.0.1:{server.server_port}"
    prom = start_prometheus(workdir / "prom", timeout=timeout, scrape_targets=[target], job=JOB,
                            node=NODE, interval="1s", rule_files=(rules,))
    pair = AlertingPrometheus(prom, target, flags, stop, [server])
    try:
        wait_until(lambda: _states(prom.url) >= {("GPUStraggler", "firing"),
                                                 ("NodeImbalance", "pending")},
                   timeout, what="GPUStraggler firing and NodeImbalance pending")
        time.sleep(1.0)
        flags.labels("util_overstates_sm", "warning", NODE, "0", "").set(1)
        wait_until(lambda: ("VerlUtilOverstatesSm", "firing") in _states(prom.url), timeout,
                   what="the consequence flag's alert firing")
        # the pages read the steps from the source's time range (found once a minute boundary
        # passed); three of them, so the last steps' window holds the samples a phase's figures
        # need (3 per GPU; gen's counters rise ~1 a second, a step lasts 2 s). Counted as the
        # pages count them: the stand-in numbers its steps from before Prometheus started, so
        # on a loaded machine the first scrape may already read step 3, and a step that ended
        # before the first scrape is outside the range.
        src = PrometheusSource(prom.url, job=JOB)
        try:
            wait_until(lambda: _steps_read(src) >= 3, timeout, what="three steps the pages read")
        finally:
            src.close()
    except BaseException:
        pair.stop()
        raise
    return pair


def _states(url: str) -> set[tuple[str, str]]:
    import httpx

    body = httpx.get(f"{url}/api/v1/alerts", timeout=5).json()
    return {(a["labels"]["alertname"], a["state"]) for a in body["data"]["alerts"]}


def _steps_read(src: PrometheusSource) -> int:
    """The steps a page reads: those ending inside the source's time range (0 before it has
    one)."""
    rng = src.time_range()
    return len(src.steps(*rng)) if rng else 0
