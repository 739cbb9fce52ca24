"""Proof of the GPU exporter on a real GPU (one call of the device tool, < 8 minutes).

What it does, in order:

1. ``cost``: in this process, while a bf16 matmul load runs, the per-call cost of each NVML
   read, then our ``NvmlBackend.sample()`` against a bare Python loop reading the same fields
   (same GPM metrics, same energy cadence, same XID poll), interleaved, CPU time per GPU per
   sample, and the ratio.
2. ``baseline``: the GPU load alone (no exporter): step times of matmul, copy and tiny kernels.
3. ``exporter_1s`` and ``exporter_0.1s`` (the second with ``--dcgm-compat``): the real
   exporter (``python -m monitor exporter --gpu-backend nvml``) as a subprocess beside a load
   cycling idle -> matmul -> copy -> tiny kernels; /metrics scraped every second. Checks that
   SM/tensor/DRAM activity follow the load (ANCHORS.md's table), exporter CPU per sample per
   GPU, scrape latency p50/p99, and the load's step time against the baseline.

Writes ``device_exporter_<date>.json`` and ``.txt`` (plus one exposition text per exporter run)
to ``--out`` (default ``$OUT``, else ``bench/results``). ``--dry-run`` runs the whole flow here
without a GPU: sim backend, a load that only sleeps, checks reported as SKIP.

    PYTHONUNBUFFERED=1 python3 bench/device_exporter.py            # on the H200
    .venv/bin/python bench/device_exporter.py --dry-run --phase-s 4  # here, no GPU
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LOAD_PHASES = ("idle", "matmul", "copy", "tiny")

# ---------------------------------------------------------------------------- GPU load worker


def run_worker(schedule: str, dry: bool) -> int:
    """The GPU load (a subprocess): phases from ``name:seconds,...``; one JSON line per phase."""
    phases = [(p.split(":")[0], float(p.split(":")[1])) for p in schedule.split(",") if p]
    if dry:
        print(json.dumps({"ready": time.time()}), flush=True)
        for name, secs in phases:
            t0 = time.time()
            time.sleep(secs)
            print(json.dumps({"phase": name, "start": t0, "end": time.time(), "steps": 0,
                              "step_s_median": None, "step_s_mean": None}), flush=True)
        return 0
    import torch

    dev = torch.device("cuda")
    n = 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    c = torch.empty(n, n, device=dev, dtype=torch.bfloat16)
    src = torch.empty(1 << 30, device=dev, dtype=torch.float32)  # 4 GiB
    dst = torch.empty_like(src)
    src.fill_(1.0)
    tiny = torch.zeros(256, device=dev)

    def step(kind: str) -> None:
        if kind == "matmul":
            for _ in range(20):
                torch.matmul(a, b, out=c)
        elif kind == "copy":
            for _ in range(10):
                dst.copy_(src)
        elif kind == "tiny":
            for _ in range(500):
                tiny.add_(1.0)
        torch.cuda.synchronize()

    for kind in ("matmul", "copy", "tiny"):
        for _ in range(3):
            step(kind)
    print(json.dumps({"ready": time.time()}), flush=True)
    for name, secs in phases:
        t0 = time.time()
        times: list[float] = []
        while time.time() - t0 < secs:
            if name == "idle":
                time.sleep(0.05)
                continue
            s = time.perf_counter()
            step(name)
            times.append(time.perf_counter() - s)
        # drop the first steps of a phase (clock ramp) from the step-time figure
        body = times[len(times) // 10:] if len(times) > 10 else times
        print(json.dumps({
            "phase": name, "start": t0, "end": time.time(), "steps": len(times),
            "step_s_median": statistics.median(body) if body else None,
            "step_s_mean": statistics.fmean(body) if body else None,
        }), flush=True)
    return 0


def start_worker(schedule: str, dry: bool) -> tuple[subprocess.Popen, float]:
    """Start the load worker and wait until its tensors are ready; returns (proc, ready time)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", schedule]
    if dry:
        cmd.append("--dry-run")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    line = proc.stdout.readline() if proc.stdout else ""
    if not line:
        raise RuntimeError("the GPU load worker exited before it was ready")
    return proc, json.loads(line)["ready"]


def finish_worker(proc: subprocess.Popen, timeout: float) -> list[dict[str, Any]]:
    """Wait for the worker and return its per-phase records."""
    out, _ = proc.communicate(timeout=timeout)
    return [json.loads(x) for x in out.splitlines() if x.strip().startswith("{")]


# ---------------------------------------------------------------------------- NVML cost


def bare_loop_factory(nvml: Any, energy_interval: float):
    """A bare Python loop reading what NvmlBackend reads, for the cost baseline."""
    from exporters.gpu.nvml import GPM_METRICS

    count = nvml.nvmlDeviceGetCount()
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    gpm = []
    for h in handles:
        s = [nvml.nvmlGpmSampleAlloc(), nvml.nvmlGpmSampleAlloc()]
        mg = nvml.c_nvmlGpmMetricsGet_t()
        mg.version = nvml.NVML_GPM_METRICS_GET_VERSION
        mg.numMetrics = len(GPM_METRICS)
        for k, mid in enumerate(GPM_METRICS):
            mg.metrics[k].metricId = mid
        nvml.nvmlGpmSampleGet(h, s[0])
        gpm.append([s, mg])
    try:
        es = nvml.nvmlEventSetCreate()
        for h in handles:
            nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, es)
    except Exception:  # noqa: BLE001
        es = None
    next_energy = [0.0]

    def loop() -> list[tuple]:
        out = []
        if es is not None:
            try:
                nvml.nvmlEventSetWait(es, 0)
            except nvml.NVMLError:
                pass
        now = time.monotonic()
        energy = now >= next_energy[0]
        if energy and energy_interval > 0:
            next_energy[0] = now + energy_interval
        for h, (s, mg) in zip(handles, gpm, strict=True):
            u = nvml.nvmlDeviceGetUtilizationRates(h).gpu
            m = nvml.nvmlDeviceGetMemoryInfo(h)
            p = nvml.nvmlDeviceGetPowerUsage(h)
            t = nvml.nvmlDeviceGetTemperature(h, 0)
            c = nvml.nvmlDeviceGetClockInfo(h, 1)
            r = nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
            e = nvml.nvmlDeviceGetTotalEnergyConsumption(h) if energy and energy_interval else 0
            nvml.nvmlGpmSampleGet(h, s[1])
            mg.sample1, mg.sample2 = s[0], s[1]
            nvml.nvmlGpmMetricsGet(mg)
            vals = [mg.metrics[k].value for k in range(mg.numMetrics)]
            s.reverse()
            out.append((u, m.used, m.total, p, t, c, r, e, vals))
        return out

    return loop, count


def per_call_costs(nvml: Any, reps: int = 200) -> dict[str, float]:
    """Mean wall microseconds of each NVML call on GPU 0 (energy with fewer repetitions)."""
    h = nvml.nvmlDeviceGetHandleByIndex(0)
    s = nvml.nvmlGpmSampleAlloc()
    calls = {
        "utilization": lambda: nvml.nvmlDeviceGetUtilizationRates(h),
        "memory": lambda: nvml.nvmlDeviceGetMemoryInfo(h),
        "power": lambda: nvml.nvmlDeviceGetPowerUsage(h),
        "temperature": lambda: nvml.nvmlDeviceGetTemperature(h, 0),
        "sm_clock": lambda: nvml.nvmlDeviceGetClockInfo(h, 1),
        "clock_events": lambda: nvml.nvmlDeviceGetCurrentClocksEventReasons(h),
        "gpm_sample": lambda: nvml.nvmlGpmSampleGet(h, s),
        "total_energy": lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(h),
    }
    out = {}
    for name, fn in calls.items():
        n = 20 if name == "total_energy" else reps
        fn()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        out[name] = (time.perf_counter() - t0) / n * 1e6
    nvml.nvmlGpmSampleFree(s)
    return out


def measure_cost(iterations: int, energy_interval: float) -> dict[str, Any]:
    """Our backend against the bare loop, interleaved, CPU seconds per GPU per sample."""
    import pynvml as nvml

    from exporters.gpu.nvml import NvmlBackend

    backend = NvmlBackend(energy_interval=energy_interval)
    nvml.nvmlInit()  # reference-counted: the backend's init stays valid
    calls = per_call_costs(nvml)
    bare, count = bare_loop_factory(nvml, energy_interval)
    ours_cpu, bare_cpu, ours_wall, bare_wall = [], [], [], []

    def timed(fn) -> tuple[float, float, Any]:
        c0, w0 = time.thread_time(), time.perf_counter()
        out = fn()
        return time.thread_time() - c0, time.perf_counter() - w0, out

    backend.sample()
    bare()
    time.sleep(0.11)
    readings = []
    for i in range(iterations):
        # alternate who goes first: the first call after a sleep pays the cold caches
        if i % 2 == 0:
            oc, ow, readings = timed(backend.sample)
            bc, bw, _ = timed(bare)
        else:
            bc, bw, _ = timed(bare)
            oc, ow, readings = timed(backend.sample)
        ours_cpu.append(oc)
        bare_cpu.append(bc)
        ours_wall.append(ow)
        bare_wall.append(bw)
        time.sleep(0.105)  # GPM samples want >= 100 ms between them
    # where our sample() spends its time (for the report)
    import cProfile
    import io
    import pstats

    prof = cProfile.Profile()
    for _ in range(30):
        prof.enable()
        backend.sample()
        prof.disable()
        time.sleep(0.105)
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
    last = readings[0]
    backend_unsupported = backend.unsupported()
    backend.close()
    nvml.nvmlShutdown()
    ours = statistics.fmean(ours_cpu) / count
    base = statistics.fmean(bare_cpu) / count
    ours_w = statistics.median(ours_wall) / count
    base_w = statistics.median(bare_wall) / count
    return {
        "gpus": count,
        "iterations": iterations,
        "energy_interval_s": energy_interval,
        "per_call_us": {k: round(v, 1) for k, v in calls.items()},
        "ours_ms_per_gpu_sample": round(ours * 1e3, 4),
        "bare_ms_per_gpu_sample": round(base * 1e3, 4),
        "ratio_ours_over_bare": round(ours / base, 3) if base else None,
        "ours_core_pct_at_1s_per_gpu": round(ours * 100, 4),
        "ours_wall_median_ms_per_gpu_sample": round(ours_w * 1e3, 4),
        "bare_wall_median_ms_per_gpu_sample": round(base_w * 1e3, 4),
        "ratio_wall_median": round(ours_w / base_w, 3) if base_w else None,
        "cpu_median_ms": [round(statistics.median(ours_cpu) / count * 1e3, 4),
                          round(statistics.median(bare_cpu) / count * 1e3, 4)],
        "thread_time_resolution_s": time.get_clock_info("thread_time").resolution,
        "profile_top": buf.getvalue().splitlines()[-20:],
        "last_reading_gpu0": {k: v for k, v in vars(last).items() if k != "xid_counts"},
        "unsupported": {str(k): v for k, v in backend_unsupported.items()},
    }


# ---------------------------------------------------------------------------- exporter runs


def free_port() -> int:
    """A free TCP port on localhost."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def parse_exposition(text: str) -> dict[str, dict[tuple, float]]:
    """name -> {label tuple: value} from Prometheus text format (no external parser)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, dict[tuple, float]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


class Scraper(threading.Thread):
    """Scrapes /metrics every ``period`` seconds; keeps (t, latency, size, parsed)."""

    def __init__(self, url: str, period: float = 1.0) -> None:
        super().__init__(daemon=True)
        self.url, self.period = url, period
        self.samples: list[tuple[float, float, int, dict]] = []
        self.errors = 0
        self.last_text = ""
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            t = time.time()
            try:
                s = time.perf_counter()
                with urllib.request.urlopen(self.url, timeout=5) as resp:
                    body = resp.read()
                lat = time.perf_counter() - s
                text = body.decode()
                self.last_text = text
                self.samples.append((t, lat, len(body), parse_exposition(text)))
            except Exception:  # noqa: BLE001 - counted
                self.errors += 1
            self._halt.wait(max(0.0, self.period - (time.time() - t)))

    def halt(self) -> None:
        self._halt.set()
        self.join(timeout=10)


def wait_up(url: str, timeout: float, marker: bytes = b"verlmon_gpu_") -> bool:
    """True once the URL answers 200 with ``marker`` in its body within ``timeout`` s."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status == 200 and marker in resp.read():
                    return True
        except Exception:  # noqa: BLE001
            pass
        time.sleep(0.2)
    return False


def _nvitop_gpus(text: str) -> int:
    """GPUs in an nvitop-exporter scrape (its per-GPU utilization series, ``index`` label)."""
    import re

    return len(set(re.findall(r'^gpu_utilization_percent\{[^}]*index="(\d+)"', text, re.M)))


def cpu_seconds(pid: int, children: bool = False) -> float:
    """User + system CPU seconds of a process, from /proc; with ``children``, plus those of
    its children it has waited for (the exporter's py-spy runs)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])
    if children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / os.sysconf("SC_CLK_TCK")


def gpu_value(parsed: dict, name: str, gpu: str = "0") -> float | None:
    """One GPU's value of a ``{gpu}``-labelled series."""
    return parsed.get(name, {}).get((("gpu", gpu),))


def phase_medians(samples: list, phases: list[dict], settle: float) -> dict[str, dict]:
    """Median per signal per load phase, from scrapes inside the phase after ``settle`` s."""
    from monitor import metric_names as mn

    signals = {
        "util": mn.GPU_UTIL, "sm_active": mn.GPU_SM_ACTIVE, "sm_occupancy": mn.GPU_SM_OCCUPANCY,
        "tensor_active": mn.GPU_TENSOR_ACTIVE, "dram_active": mn.GPU_DRAM_ACTIVE,
        "power_w": mn.GPU_POWER, "sm_clock_hz": mn.GPU_SM_CLOCK,
    }
    out = {}
    for ph in phases:
        inside = [p for t, _l, _b, p in samples if ph["start"] + settle <= t <= ph["end"]]
        row: dict[str, Any] = {"scrapes": len(inside)}
        for key, metric in signals.items():
            vals = [v for v in (gpu_value(p, metric) for p in inside) if v is not None]
            row[key] = round(statistics.median(vals), 4) if vals else None
        out[ph["phase"]] = row
    return out


def activity_checks(table: dict[str, dict]) -> list[dict[str, Any]]:
    """PASS/FAIL per load phase against the pattern in ANCHORS.md's table."""

    def v(phase: str, key: str) -> float:
        x = table.get(phase, {}).get(key)
        return float("nan") if x is None else x

    rules = [
        ("idle: all low", "idle", lambda: max(v("idle", k) for k in
                                               ("util", "sm_active", "tensor_active",
                                                "dram_active")) <= 0.10),
        ("matmul: tensor high", "matmul", lambda: v("matmul", "tensor_active") >= 0.5),
        ("matmul: SM active high", "matmul", lambda: v("matmul", "sm_active") >= 0.5),
        ("copy: DRAM high", "copy", lambda: v("copy", "dram_active") >= 0.5),
        ("copy: tensor low", "copy", lambda: v("copy", "tensor_active") <= 0.2),
        ("tiny: util >> SM active", "tiny",
         lambda: v("tiny", "util") >= 1.5 * v("tiny", "sm_active")
         and v("tiny", "util") - v("tiny", "sm_active") >= 0.1),
    ]
    out = []
    for name, phase, ok in rules:
        row = table.get(phase, {})
        out.append({"check": name, "result": "PASS" if ok() else "FAIL",
                    "values": {k: row.get(k) for k in
                               ("util", "sm_active", "tensor_active", "dram_active")}})
    return out


def nvitop_command(interval: float, port: int) -> list[str]:
    """nvitop-exporter (the anchor of issue 39's cost) on ``port`` at ``interval``, as its
    README starts it; carried as wheels to the GPU machine (``pip install nvitop-exporter``)."""
    return [sys.executable, "-m", "nvitop_exporter", "--bind-address", "127.0.0.1",
            "--port", str(port), "--interval", str(interval)]


def run_exporter(interval: float, schedule: str, dry: bool, dcgm: bool, settle: float,
                 out_dir: Path, label: str, only_gpu: bool = False,
                 extra_args: list[str] | None = None, pyspy: bool = True,
                 nvitop: bool = False) -> dict[str, Any]:
    """One exporter run beside the load cycle; returns its figures.

    ``only_gpu`` turns every other collector off (to tell the GPU sampler's cost apart). The
    exporter is started as ``verl-monitor run`` starts it (this process names itself in
    ``VERLMON_RUN_PID``), so the load worker, our other child, is the job it may read: with
    ``pyspy`` its steady py-spy readings run (``hang.sample_s``); without, ``--no-hang-pyspy``.
    ``nvitop``: nvitop-exporter instead of ours, beside the same load (its CPU, its scrape
    time and the load's step time; the activity checks are ours alone).
    """
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    cmd = [sys.executable, "-m", "monitor", "exporter", "--listen-address",
           f"127.0.0.1:{port}", "--interval", str(interval), "--node", "bench",
           "--gpu-backend", "sim" if dry else "nvml"]
    if dry:
        cmd += ["--scenario", "healthy"]
    if dcgm:
        cmd.append("--dcgm-compat")
    if only_gpu:
        from exporters.registry import COLLECTOR_MODULES

        cmd += [f"--no-collector.{c}" for c in COLLECTOR_MODULES if c != "gpu"]
    if not pyspy:
        cmd.append("--no-hang-pyspy")
    cmd += list(extra_args or [])
    if nvitop:
        cmd = nvitop_command(interval, port)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p), PYTHONUNBUFFERED="1",
               VERLMON_RUN_PID=str(os.getpid()))
    log_path = out_dir / f"exporter_{label}.log"
    with open(log_path, "w") as log:
        exp = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    result: dict[str, Any] = {"interval_s": interval, "command": " ".join(cmd[1:]),
                              "dcgm_compat": dcgm}
    try:
        if not wait_up(url, 60, b"nvitop" if nvitop else b"verlmon_gpu_"):
            result["error"] = "exporter did not answer within 60 s: " + log_path.read_text()[-800:]
            return result
        worker, _ready = start_worker(schedule, dry)
        scraper = Scraper(url, 1.0)
        cpu0, t0 = cpu_seconds(exp.pid), time.time()
        all0 = cpu_seconds(exp.pid, children=True)
        scraper.start()
        phases = finish_worker(worker, timeout=600)
        cpu1, t1 = cpu_seconds(exp.pid), time.time()
        all1 = cpu_seconds(exp.pid, children=True)
        scraper.halt()
        (out_dir / f"exposition_{label}.txt").write_text(scraper.last_text)
        gpus = len(scraper.samples[-1][3].get("verlmon_gpu_up", {})) if scraper.samples else 0
        if nvitop:
            gpus = _nvitop_gpus(scraper.last_text)
        lats = sorted(x[1] for x in scraper.samples)
        wall = t1 - t0
        samples = wall / interval
        cpu = cpu1 - cpu0
        table = phase_medians(scraper.samples, phases, settle)
        result.update({
            "gpus": gpus,
            "wall_s": round(wall, 1),
            "scrapes": len(scraper.samples), "scrape_errors": scraper.errors,
            "scrape_p50_ms": round(_pct(lats, 50) * 1e3, 2) if lats else None,
            "scrape_p99_ms": round(_pct(lats, 99) * 1e3, 2) if lats else None,
            "exposition_bytes": scraper.samples[-1][2] if scraper.samples else None,
            "exporter_cpu_s": round(cpu, 3),
            "exporter_core_pct": round(cpu / wall * 100, 3),
            "exporter_and_pyspy_core_pct": round((all1 - all0) / wall * 100, 3),
            "pyspy_steady_rounds": sum(v for k, v in (scraper.samples[-1][3] if scraper.samples
                                                      else {}).get(
                "verlmon_hang_dump_rounds_total", {}).items()
                if dict(k).get("method") == "py-spy-steady"),
            "job_processes": (scraper.samples[-1][3] if scraper.samples else {}).get(
                "verlmon_hang_job_processes", {}).get((), None),
            "exporter_ms_per_sample_per_gpu": round(cpu / samples / max(gpus, 1) * 1e3, 4),
            "phases": phases,
            "activity": table,
            "checks": [] if dry or nvitop else activity_checks(table),
            "exporter": "nvitop-exporter" if nvitop else "verl-monitor",
            "dcgm_series": sorted({n for n in (scraper.samples[-1][3] if scraper.samples
                                               else {}) if n.startswith("DCGM_")}),
        })
        return result
    finally:
        exp.send_signal(signal.SIGTERM)
        try:
            result["exporter_exit"] = exp.wait(timeout=15)
        except subprocess.TimeoutExpired:
            exp.kill()
            result["exporter_exit"] = "killed"


def _pct(sorted_vals: list[float], q: float) -> float:
    k = min(len(sorted_vals) - 1, max(0, round(q / 100 * (len(sorted_vals) - 1))))
    return sorted_vals[k]


def run_direct(interval: float, schedule: str, settle: float) -> dict[str, Any]:
    """The backend in this process (no exporter) beside the load cycle: readings per phase."""
    from exporters.collectors.gpu import GAUGES
    from exporters.gpu.nvml import NvmlBackend

    backend = NvmlBackend()
    samples: list[tuple[float, float, int, dict]] = []
    halt = threading.Event()

    def sampler() -> None:
        while not halt.wait(interval):
            t = time.time()
            r = backend.sample()[0]
            parsed = {name: {(("gpu", "0"),): getattr(r, attr)} for name, _h, attr in GAUGES
                      if getattr(r, attr) is not None}
            samples.append((t, 0.0, 0, parsed))

    th = threading.Thread(target=sampler, daemon=True)
    worker, _ = start_worker(schedule, False)
    th.start()
    phases = finish_worker(worker, timeout=600)
    halt.set()
    th.join(timeout=5)
    last = backend.sample()[0]
    backend.close()
    table = phase_medians(samples, phases, settle)
    return {"interval_s": interval, "command": "in-process NvmlBackend (no exporter)",
            "phases": phases, "activity": table, "checks": activity_checks(table),
            "samples": len(samples),
            "last_reading_gpu0": {k: v for k, v in vars(last).items()}}


# ---------------------------------------------------------------------------- report


def step_ratios(baselines: list[list[dict]], runs: dict[str, dict]) -> dict[str, dict]:
    """Load step time with the exporter over without it (mean of the baselines), per kind."""
    per: dict[str, list[float]] = {}
    for baseline in baselines:
        for p in baseline:
            if p.get("step_s_median"):
                per.setdefault(p["phase"], []).append(p["step_s_median"])
    base = {k: statistics.fmean(v) for k, v in per.items()}
    out: dict[str, dict] = {}
    for label, run in runs.items():
        for p in run.get("phases", []):
            b = base.get(p["phase"])
            if b and p.get("step_s_median"):
                out.setdefault(p["phase"], {"baseline_ms": round(b * 1e3, 3)})
                out[p["phase"]][f"{label}_ms"] = round(p["step_s_median"] * 1e3, 3)
                out[p["phase"]][f"{label}_ratio"] = round(p["step_s_median"] / b, 4)
    return out


def render_text(res: dict[str, Any]) -> str:
    """The human-readable table of a result dict."""
    lines = [f"verl-monitor GPU exporter on a real GPU — {res['date']}", ""]
    env = res.get("env", {})
    lines += [f"{k}: {v}" for k, v in env.items()] + [""]
    cost = res.get("cost") or {}
    if "error" in cost:
        lines.append(f"cost: {cost['error']}")
    elif cost:
        lines.append("NVML call cost on GPU 0 (µs): " + ", ".join(
            f"{k} {v}" for k, v in cost["per_call_us"].items()))
        lines.append(
            f"sampling cost per GPU per sample: ours {cost['ours_ms_per_gpu_sample']} ms, "
            f"bare loop {cost['bare_ms_per_gpu_sample']} ms, ratio "
            f"{cost['ratio_ours_over_bare']} (bar: <= 1.3), "
            f"{cost['ours_core_pct_at_1s_per_gpu']}% of a core per GPU at 1 s")
        lines.append(
            f"wall time per GPU per sample (median): ours "
            f"{cost['ours_wall_median_ms_per_gpu_sample']} ms, bare loop "
            f"{cost['bare_wall_median_ms_per_gpu_sample']} ms, ratio "
            f"{cost['ratio_wall_median']}; CPU medians (ours, bare) {cost['cpu_median_ms']} ms")
        lines.append(f"unsupported: {cost['unsupported']}")
    lines.append("")
    for label, run in res.get("runs", {}).items():
        lines.append(f"== exporter {label}: {run.get('command', '')}")
        if "error" in run:
            lines += [f"   ERROR {run['error']}", ""]
            continue
        if "exporter_core_pct" in run:
            lines.append(
                f"   gpus {run['gpus']}, exporter {run['exporter_core_pct']}% of a core "
                f"({run.get('exporter_and_pyspy_core_pct')}% with its py-spy runs; "
                f"{run.get('pyspy_steady_rounds')} steady py-spy rounds of "
                f"{run.get('job_processes')} job process(es)), "
                f"{run['exporter_ms_per_sample_per_gpu']} ms CPU per sample per GPU; scrape "
                f"p50 {run['scrape_p50_ms']} ms p99 {run['scrape_p99_ms']} ms "
                f"({run['scrapes']} scrapes, {run['scrape_errors']} errors, "
                f"{run['exposition_bytes']} bytes)")
        lines.append("   phase   scrapes  util  sm_act  sm_occ  tensor  dram  power_w  sm_MHz")
        for ph, row in run["activity"].items():
            def f(k: str, scale: float = 1.0, row: dict = row) -> str:
                return "-" if row.get(k) is None else f"{row[k] * scale:.2f}"
            lines.append(
                f"   {ph:7s} {row['scrapes']:7d}  {f('util'):5s} {f('sm_active'):7s} "
                f"{f('sm_occupancy'):7s} {f('tensor_active'):7s} {f('dram_active'):5s} "
                f"{f('power_w'):8s} {f('sm_clock_hz', 1e-6)}")
        for c in run.get("checks", []):
            lines.append(f"   {c['result']}  {c['check']}  {c['values']}")
        if run.get("dcgm_series"):
            lines.append(f"   DCGM series: {', '.join(run['dcgm_series'])}")
        lines.append("")
    if res.get("step_time"):
        lines.append("load step time (median ms) without / with the exporter:")
        for ph, row in res["step_time"].items():
            lines.append(f"   {ph:7s} " + ", ".join(f"{k} {v}" for k, v in row.items()))
    checks = [c for r in res.get("runs", {}).values() for c in r.get("checks", [])]
    if checks:
        n_pass = sum(c["result"] == "PASS" for c in checks)
        lines += ["", f"activity checks: {n_pass}/{len(checks)} PASS"]
    return "\n".join(lines) + "\n"


def environment() -> dict[str, Any]:
    """Driver, GPU, library versions (best effort)."""
    env: dict[str, Any] = {"python": sys.version.split()[0]}
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20)
        env["nvidia_smi"] = out.stdout.strip() or out.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        env["nvidia_smi"] = f"unavailable ({exc.__class__.__name__})"
    try:
        from importlib.metadata import version

        env["nvidia_ml_py"] = version("nvidia-ml-py")
    except Exception:  # noqa: BLE001
        env["nvidia_ml_py"] = "unknown"
    env["cpus"] = os.cpu_count()
    return env


#: The numeric options of the proof: (flag, type, default, what it sets).
_NUMBER_FLAGS: tuple[tuple[str, type, float, str], ...] = (
    ("--phase-s", float, 25.0, "seconds per load phase in the exporter runs"),
    ("--baseline-s", float, 15.0, "seconds per load phase of the no-exporter baseline"),
    ("--cost-iterations", int, 150, "interleaved samples for the ours-vs-bare-loop cost"),
    ("--energy-interval", float, 10.0, "energy read cadence in seconds for the cost figures"),
)

#: The on/off options of the proof: (flag, what it does).
_SWITCHES: tuple[tuple[str, str], ...] = (
    ("--skip-cost", "skip the in-process cost comparison"),
    ("--baseline-twice", "measure the no-exporter baseline before and after the exporter runs"),
    ("--dry-run", "no GPU: sim backend, a sleeping load, no checks (tests the flow)"),
    ("--direct", "also sample with the backend in-process (no exporter) over a short load "
     "cycle; with --no-exporter this is a quick NVML check"),
    ("--no-exporter", "skip the baseline and the exporter runs (cost and --direct only)"),
    ("--no-dcgm", "no exporter run adds --dcgm-compat (runs that differ only as asked)"),
)


def main(argv: list[str] | None = None) -> int:
    """Run the whole proof; exit status 0 when every check passed (or dry run finished)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or str(ROOT / "bench" / "results"),
                    help="folder for the JSON/text results (default $OUT, else bench/results)")
    for flag, kind, default, text in _NUMBER_FLAGS:
        ap.add_argument(flag, type=kind, default=default, help=f"{text} (default {default:g})")
    ap.add_argument("--intervals", default="1,0.1",
                    help="exporter runs, comma separated: INTERVAL, INTERVAL:gpu (only the "
                    "gpu collector on), INTERVAL:nospy (--no-hang-pyspy) or INTERVAL:nosample "
                    "(py-spy only in a silence: hang.sample_s 0) or INTERVAL:nvitop "
                    "(nvitop-exporter instead, beside the same load); the last run adds "
                    "--dcgm-compat unless --no-dcgm (default 1,0.1)")
    ap.add_argument("--exporter-arg", action="append", default=[], metavar="ARG",
                    help="extra argument for every exporter run (repeat), e.g. "
                    "--exporter-arg=--detect-interval=3600")
    ap.add_argument("--tag", default="",
                    help="suffix of the result file names (device_exporter_<date>_<tag>)")
    for flag, text in _SWITCHES:
        ap.add_argument(flag, action="store_true", help=text)
    ap.add_argument("--worker", metavar="SCHEDULE", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return run_worker(args.worker, args.dry_run)
    try:
        intervals = [(float(x.split(":")[0]), x.strip().split(":", 1)[1:] or [""])
                     for x in args.intervals.split(",") if x.strip()]
    except ValueError:
        print(f"device_exporter: --intervals must be numbers, got {args.intervals!r}",
              file=sys.stderr)
        return 2
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d")
    res: dict[str, Any] = {"date": date, "dry_run": args.dry_run, "env": environment()}
    print(json.dumps(res["env"]), flush=True)

    # 1. cost, beside a matmul load (the nvitop figures in ANCHORS.md were taken that way)
    if args.dry_run or args.skip_cost:
        res["cost"] = {"error": "skipped" + (" (dry run: no NVML)" if args.dry_run else "")}
    else:
        worker, _ = start_worker(f"matmul:{args.cost_iterations * 0.11 + 8:.0f}", False)
        try:
            res["cost"] = measure_cost(args.cost_iterations, args.energy_interval)
        except Exception as exc:  # noqa: BLE001 - report and go on
            res["cost"] = {"error": f"{exc.__class__.__name__}: {exc}"}
        finish_worker(worker, timeout=120)
    print("cost:", json.dumps(res["cost"]), flush=True)
    partial = out_dir / f"device_exporter_{date}.partial.json"
    partial.write_text(json.dumps(res, indent=2, default=str))

    res["runs"] = {}
    if args.direct and not args.dry_run:
        sched = ",".join(f"{ph}:{min(args.phase_s, 10)}" for ph in LOAD_PHASES)
        try:
            res["runs"]["direct"] = run_direct(0.5, sched, settle=2.0)
        except Exception as exc:  # noqa: BLE001
            res["runs"]["direct"] = {"error": f"{exc.__class__.__name__}: {exc}"}
        print("direct:", json.dumps(res["runs"]["direct"], default=str), flush=True)
    if args.no_exporter:
        return _finish(res, out_dir, date)

    # 2. baseline step times, no exporter
    b = args.baseline_s
    worker, _ = start_worker(f"matmul:{b},copy:{b},tiny:{b}", args.dry_run)
    res["baseline"] = finish_worker(worker, timeout=600)
    print("baseline:", json.dumps(res["baseline"]), flush=True)
    res["baselines"] = [res["baseline"]]

    # 3. exporter runs beside the load cycle
    p = args.phase_s
    schedule = ",".join(f"{ph}:{p}" for ph in LOAD_PHASES)
    for i, (interval, (mode,)) in enumerate(intervals):
        label = f"{interval:g}s" + {"gpu": "-gpu-only", "nospy": "-no-pyspy",
                                     "nosample": "-no-sampling",
                                     "nvitop": "-nvitop-exporter"}.get(mode, "")
        label += f"-{i + 1}" if label in res["runs"] else ""  # a run repeated: both kept
        run = run_exporter(interval, schedule, args.dry_run,
                           dcgm=i == len(intervals) - 1 and not args.no_dcgm,
                           settle=max(3.0, 2 * interval + 2), out_dir=out_dir, label=label,
                           only_gpu=mode == "gpu", extra_args=args.exporter_arg
                           + (_no_sampling_config(out_dir) if mode == "nosample" else []),
                           pyspy=mode != "nospy", nvitop=mode == "nvitop")
        res["runs"][label] = run
        print(f"run {label}:", json.dumps({k: v for k, v in run.items() if k != "phases"}),
              flush=True)
        partial.write_text(json.dumps(res, indent=2, default=str))
    if args.baseline_twice:
        worker, _ = start_worker(f"matmul:{b},copy:{b},tiny:{b}", args.dry_run)
        res["baselines"].append(finish_worker(worker, timeout=600))
        print("baseline again:", json.dumps(res["baselines"][-1]), flush=True)
    res["step_time"] = step_ratios(res["baselines"], res["runs"])
    partial.unlink(missing_ok=True)
    return _finish(res, out_dir, date, args.tag)


def _no_sampling_config(out_dir: Path) -> list[str]:
    """Exporter arguments for py-spy on without the steady readings (``hang.sample_s`` 0: it
    reads the job only in a silence, as before issue 39)."""
    path = out_dir / "no_sampling.yaml"
    path.write_text("hang:\n  sample_s: 0\n")
    return ["--config", str(path)]


def _finish(res: dict[str, Any], out_dir: Path, date: str, tag: str = "") -> int:
    """Write the JSON and text results; 1 if a check failed or a run broke."""
    stem = f"device_exporter_{date}" + (f"_{tag}" if tag else "")
    (out_dir / f"{stem}.json").write_text(json.dumps(res, indent=2, default=str))
    text = render_text(res)
    (out_dir / f"{stem}.txt").write_text(text)
    print(text, flush=True)
    checks = [c for r in res["runs"].values() for c in r.get("checks", [])]
    failed = any(c["result"] != "PASS" for c in checks) or any(
        "error" in r for r in res["runs"].values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
