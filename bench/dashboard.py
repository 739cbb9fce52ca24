"""Dashboard figures: how long each page takes to finish rendering in Chromium, and how much
server time one live refresh costs, at two sizes:

- **store**: 8 GPUs x 6 hours of 1 s samples (172,800 GPU rows) in a run store built from the
  simulator (``tests/sample_store.py``), window "6 h";
- **prometheus**: 128 nodes x 8 GPUs x 1 hour at 15 s (the simulator's ``gpu_imbalance`` run,
  node22 straggling), written as OpenMetrics text and loaded into a real Prometheus with a
  TSDB backfill (``promtool tsdb create-blocks-from openmetrics``, far lighter on 2 cores than
  128 live exporters), window "1 h".

Page time: until the page is usable: the app is idle, the page's live panel has finished
(its "Refreshed in" line is there), every Plotly chart on it has drawn and every table has its
grid; after loading the page's URL (cold: first visit after the server started; warm: later
visits, caches filled) and after clicking the page in the sidebar (nav: how people move
between pages; no reload of the app's JavaScript). Charts in tabs not picked and expanders
not opened are not drawn (the pages draw one chart at a time), so they are not waited for.
Refresh: server time of one rerun of the page's live fragment as the page reports it
("Refreshed in X s of server time"), median of three, while new data keeps arriving (a thread
appends a sample per GPU every second to the store; a heartbeat target keeps Prometheus's
newest sample moving), so each refresh moves the window and queries fresh data.

Baselines: in the same run, two near-empty Streamlit pages served the same way are loaded by
URL right before each warm visit of a page: the "floor", a title and one two-point Plotly chart
(Streamlit with its chart library, the least a dashboard page draws), and a "bare" page, a
title alone. Each page's "x floor" ("x bare") is the median of its warm URL times over the
median of that page's, the figure to read where Streamlit's own floor (and a shared machine's
load) leaves no room under 2 s. When the Overview is benched, a third baseline, the "app
frame", is loaded before each of its visits: the real app (sidebar, navigation, source status,
live panel) with an empty Overview, so the frame's cost reads apart from what the page draws.

Usage: ``python bench/dashboard.py [--skip-store] [--skip-prometheus] [--pages Overview]
[--json PATH]``
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import NamedTuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PAGES = {"": "Overview", "gpus": "GPUs", "steps": "Steps & phases",
         "communication": "Communication", "flags": "Flags", "nodes": "Nodes"}
VIEWS = {"": None, "gpus": "gpus", "steps": "steps", "communication": "communication",
         "flags": "flags", "nodes": "nodes"}
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")

_READY_JS = """([title, panel]) => {
  const h1 = document.querySelector("h1");
  if (!h1 || !h1.textContent.includes(title)) return -1;
  const app = document.querySelector("[data-testid='stApp']");
  if (!app || app.getAttribute('data-test-script-state') !== 'notRunning') return -1;
  if (document.querySelector("[data-testid='stException']")) return -2;
  // a chart or table whose code is still loading shows a skeleton in its place
  if (document.querySelector("[data-testid='stSkeleton']")) return -1;
  if (panel && ![...document.querySelectorAll("[data-testid='stCaptionContainer']")]
      .some(c => c.textContent.startsWith('Refreshed in'))) return -1;
  const plots = [...document.querySelectorAll("[data-testid='stPlotlyChart']")];
  if (plots.some(p => !p.querySelector('.main-svg'))) return -1;
  const tables = [...document.querySelectorAll("[data-testid='stDataFrame']")];
  if (tables.some(t => !t.querySelector('canvas'))) return -1;
  return plots.length + '/' + tables.length;
}"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url, timeout=1)
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout:.0f} s")


# ----------------------------------------------------------------------------- data
def build_store(path: Path) -> dict:
    """8 GPUs x 6 h at 1 s, with an IO-starvation stretch and a reshard spike."""
    from tests.sample_store import build_store as build

    script = "healthy:240,io_starvation:60,healthy:200,reshard_spike:20,healthy:200"
    return build(path, scenario=script, step_seconds=30.0, detect=True)


def build_prometheus(workdir: Path, nodes: int = 128,
                     heartbeat: int | None = None) -> tuple[subprocess.Popen, str, dict]:
    """Backfill 128 nodes x 8 GPUs x 1 h at 15 s into a fresh TSDB and start Prometheus."""
    from monitor import metric_names as m
    from monitor.sim.engine import SimRun

    end = time.time() - 30
    run = SimRun("gpu_imbalance", steps=120, nodes=nodes, gpus_per_node=8, step_seconds=30.0,
                 start_time=end - 3600, seed=3)
    gpu = run.gpu_frame(15.0)
    host = run.host_frame(15.0)
    text = workdir / "data.om"
    t0 = time.perf_counter()
    with text.open("w") as fh:
        def family(name: str, kind: str = "gauge") -> None:
            fh.write(f"# TYPE {name} {kind}\n")

        def lab(node: str, **extra: object) -> str:
            parts = ['job="verlmon"', f'instance="{node}:9048"', f'node="{node}"']
            parts += [f'{k}="{v}"' for k, v in extra.items()]
            return "{" + ",".join(parts) + "}"

        grid = sorted(gpu["ts"].unique())
        family(m.BUILD_INFO)
        for node in run.node_names:
            label = lab(node, version="bench")
            fh.writelines(f"{m.BUILD_INFO}{label} 1 {t:.3f}\n" for t in grid)
        for col, metric, scale in (("util", m.GPU_UTIL, 0.01), ("sm_active", m.GPU_SM_ACTIVE, 0.01),
                                   ("mem_used_bytes", m.GPU_MEM_USED, 1.0),
                                   ("mem_total_bytes", m.GPU_MEM_TOTAL, 1.0)):
            family(metric)
            for (node, idx), part in gpu.groupby(["node", "gpu"], sort=True):
                label = lab(node, gpu=int(idx))
                fh.writelines(f"{metric}{label} {v * scale:.6g} {t:.3f}\n"
                              for t, v in zip(part["ts"], part[col], strict=True))
        for col, metric in (("cpu_max_core_pct", m.HOST_CPU_MAX_CORE),
                            ("cpu_avg_pct", m.HOST_CPU_AVG), ("iowait_pct", m.HOST_IOWAIT)):
            family(metric)
            for node, part in host.groupby("node", sort=True):
                fh.writelines(f"{metric}{lab(node)} {v / 100:.6g} {t:.3f}\n"
                              for t, v in zip(part["ts"], part[col], strict=True))
        steps = [(s.end, s) for s in run.steps]
        driver = run.node_names[0]

        def step_at(t: float):
            done = [s for e, s in steps if e <= t]
            return done[-1] if done else None

        series = {m.TRAIN_STEP: [], m.STEP_DURATION: [], m.LAST_STEP_TS: []}
        phases: dict[str, list] = {}
        for t in grid:
            s = step_at(t)
            if s is None:
                continue
            series[m.TRAIN_STEP].append((t, s.step))
            series[m.STEP_DURATION].append((t, s.total))
            series[m.LAST_STEP_TS].append((t, s.end))
            for ph, sec in s.durations().items():
                phases.setdefault(ph, []).append((t, sec))
        for metric, pts in series.items():
            family(metric)
            fh.writelines(f"{metric}{lab(driver)} {v:.6f} {t:.3f}\n" for t, v in pts)
        family(m.PHASE_DURATION)
        for ph, pts in sorted(phases.items()):
            fh.writelines(f"{m.PHASE_DURATION}{lab(driver, phase=ph)} {v:.6f} {t:.3f}\n"
                          for t, v in pts)
        family(m.FLAG_ACTIVE)
        for truth in run.truth:
            scope = truth["scope"]
            node = scope.get("node", driver)
            # the flags collector's labels: node, gpu (indices joined by commas), phase
            where = {"gpu": ",".join(str(g) for g in scope.get("gpus") or []),
                     "phase": scope.get("phase") or ""}
            label = lab(node, kind=truth["kind"], severity="warning",
                        **{k: v for k, v in where.items() if v})
            fh.writelines(f"{m.FLAG_ACTIVE}{label} 1 {t:.3f}\n"
                          for t in grid if truth["start"] + 120 <= t <= truth["end"])
        fh.write("# EOF\n")
    write_s = time.perf_counter() - t0
    tsdb = workdir / "tsdb"
    t0 = time.perf_counter()
    subprocess.run(["promtool", "tsdb", "create-blocks-from", "openmetrics", str(text), str(tsdb)],
                   check=True, capture_output=True)
    backfill_s = time.perf_counter() - t0
    text.unlink()
    cfg = workdir / "prometheus.yml"
    targets = f"['127.0.0.1:{heartbeat}']" if heartbeat else "[]"
    cfg.write_text("global:\n  scrape_interval: 15s\nscrape_configs:\n  - job_name: verlmon\n"
                   "    scrape_interval: 15s\n    static_configs:\n"
                   f"      - targets: {targets}\n        labels: {{node: node0}}\n")
    port = free_port()
    proc = subprocess.Popen(["prometheus", f"--config.file={cfg}",
                             f"--storage.tsdb.path={tsdb}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/-/ready")
    info = {"gpu_series": nodes * 8, "gpu_samples": len(gpu), "write_s": round(write_s, 1),
            "backfill_s": round(backfill_s, 1)}
    return proc, url, info


# ----------------------------------------------------------------------------- timing
BASELINE_TITLE = "Baseline"
BASELINE_APP = f"""import plotly.graph_objects as go
import streamlit as st

st.title("{BASELINE_TITLE}")
st.plotly_chart(go.Figure(go.Scatter(x=[0, 1], y=[0, 1])))
"""
BARE_TITLE = "Bare"
BARE_APP = f"""import streamlit as st

st.title("{BARE_TITLE}")
"""


def start_app(env_name: str, value: str,
              script: Path | None = None) -> tuple[subprocess.Popen, str]:
    from cli.commands.dashboard import app_path, source_env, streamlit_command

    port = free_port()
    env = source_env(**({"store": value} if env_name == "store" else {"prometheus": value}))
    cmd = streamlit_command(port, "127.0.0.1")
    if script is not None:
        cmd[cmd.index(str(app_path()))] = str(script)
    proc = subprocess.Popen(cmd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_http(url + "/_stcore/health")
    return proc, url


def _wait_drawn(page, title: str, t0: float, what: str,
                panel: bool = True) -> tuple[float, str]:
    """Seconds from ``t0`` until the page shows ``title`` usable (``_READY_JS``; with ``panel``
    its live panel has finished too), and what it drew ("charts/tables"). What it drew must hold
    for 0.4 s; the time is when it was first reached."""
    last, seen_at, stable_since = -1, None, None
    deadline = t0 + 120
    while time.perf_counter() < deadline:
        n = page.evaluate(_READY_JS, [title, panel])
        now = time.perf_counter()
        if n == -2:
            raise RuntimeError(f"exception rendered on {what}")
        if n != -1 and n == last:
            if now - stable_since >= 0.4:
                return seen_at - t0, n
        elif n != -1:
            seen_at, stable_since = now, now
        last = n
        time.sleep(0.05)
    raise RuntimeError(f"{what} did not finish rendering in 120 s")


class PageTime(NamedTuple):
    """One page's figures (seconds; ``drawn`` is "charts/tables")."""

    cold: float
    warm: float
    nav: float
    drawn: str
    x_floor: float
    x_bare: float


def page_times(url: str, window: str, floor_url: str, bare_url: str,
               rounds: int = 3, frame_url: str | None = None,
               ) -> tuple[dict[str, PageTime], dict[str, tuple[float, float]]]:
    """Per page: seconds until usable after loading the page's URL first (cold) and again
    (warm: the median of ``rounds`` visits), and after clicking it in the sidebar (nav). Each
    visit follows a visit of the one-chart page at ``floor_url`` and of the title-only page at
    ``bare_url``, so load on a shared machine hits all three alike; "x floor" ("x bare") is the
    median of the page's warm visits over the median of that page's. With ``frame_url`` (the
    app with an empty Overview, :func:`start_frame`) that is visited before each Overview visit
    too. Also returns each baseline's (cold, warm median)."""
    from playwright.sync_api import sync_playwright

    out: dict[str, list] = {}
    base: dict[str, list[float]] = {"floor": [], "bare": [], **({"frame": []} if frame_url
                                                                 else {})}
    query = f"?window={window.replace(' ', '+')}&refresh=off"
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})

        def visit(target: str, title: str, what: str, panel: bool) -> tuple[float, str]:
            t0 = time.perf_counter()
            page.goto(target, wait_until="commit")
            return _wait_drawn(page, title, t0, what, panel)

        for _visit in range(1 + rounds):
            for path, title in PAGES.items():
                base["floor"].append(visit(floor_url + "/", BASELINE_TITLE, "floor page",
                                           False)[0])
                base["bare"].append(visit(bare_url + "/", BARE_TITLE, "bare page", False)[0])
                if frame_url and path == "":
                    base["frame"].append(visit(f"{frame_url}/{query}", "Overview", "app frame",
                                               True)[0])
                out.setdefault(path, []).append(visit(f"{url}/{path}{query}", title, f"/{path}",
                                                      True))
        order = list(PAGES.items())
        for (path, title) in order[1:] + order[:1]:
            link = page.get_by_test_id("stSidebarNav").get_by_role("link", name=title)
            t0 = time.perf_counter()
            link.click()
            out[path].append(_wait_drawn(page, title, t0, f"/{path} (sidebar)"))
        browser.close()
    warm = {k: statistics.median(v[len(PAGES) if k != "frame" else 1:])
            for k, v in base.items()}
    result = {}
    for p, v in out.items():
        w = statistics.median(x[0] for x in v[1:1 + rounds])
        result[p] = PageTime(v[0][0], w, v[-1][0], v[1][1], w / warm["floor"], w / warm["bare"])
    return result, {k: (base[k][0], warm[k]) for k in base}


def start_baseline(workdir: Path, name: str = "floor") -> tuple[subprocess.Popen, str]:
    """A near-empty Streamlit page served like the app: ``floor`` (a title and one small
    chart) or ``bare`` (a title alone)."""
    script = workdir / f"{name}_app.py"
    script.write_text(BASELINE_APP if name == "floor" else BARE_APP)
    return start_app("store", str(workdir / "none.db"), script)


#: The Overview of the "app frame" baseline: the real app (sidebar, navigation, source status,
#: live panel) with nothing in the panel, to tell what the frame costs from what a page draws.
FRAME_OVERVIEW = """import streamlit as st
from dashboards import common

settings = common.settings()
st.title("Overview")


@common.live_panel(settings)
def live(start, end, key):
    pass


live()
"""


def start_frame(workdir: Path, kind: str, value: str) -> tuple[subprocess.Popen, str]:
    """The app, copied with :data:`FRAME_OVERVIEW` as its Overview, on the same source."""
    copy = workdir / "frame_app"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(REPO / "dashboards", copy / "dashboards",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "dashboards" / "views" / "overview.py").write_text(FRAME_OVERVIEW)
    return start_app(kind, value, copy / "dashboards" / "app.py")


def refresh_times(url: str, window: str, refreshes: int = 3) -> dict[str, float]:
    """Median server seconds of the live fragment's reruns, as the page itself reports them
    ("Refreshed in X s of server time"), while new data keeps arriving."""
    from playwright.sync_api import sync_playwright

    out = {}
    pattern = re.compile(r"Refreshed in ([0-9.]+) s of server time")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        for path in PAGES:
            page.goto(f"{url}/{path}?window={window.replace(' ', '+')}&refresh=2+s")
            seen: list[str] = []
            deadline = time.monotonic() + 60
            while len(seen) < refreshes + 1 and time.monotonic() < deadline:
                texts = page.get_by_text(pattern).all_inner_texts()
                if texts and (not seen or texts[-1] != seen[-1]):
                    seen.append(texts[-1])
                time.sleep(0.1)
            values = [float(pattern.search(t).group(1)) for t in seen[1:]]
            if not values:
                raise RuntimeError(f"/{path}: no live refresh seen within 60 s")
            out[path] = statistics.median(values)
        browser.close()
    return out


class StoreFeeder(threading.Thread):
    """Appends one sample per GPU and one host sample every second, like a running exporter,
    so the window moves and every live refresh queries fresh data."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path = path
        self.halt = threading.Event()

    def run(self) -> None:
        from monitor.store.runstore import RunStore

        store = RunStore(self.path)
        try:
            while not self.halt.wait(1.0):
                now = time.time()
                store.add_gpu_samples([{"ts": now, "node": "node0", "gpu": g, "util": 90.0,
                                        "sm_active": 70.0, "mem_used_bytes": 80e9,
                                        "mem_total_bytes": 141e9} for g in range(8)])
                store.add_host_samples([{"ts": now, "node": "node0", "cpu_max_core_pct": 40.0,
                                         "cpu_avg_pct": 20.0, "iowait_pct": 1.0}])
        finally:
            store.close()


class HeartbeatTarget:
    """A scrape target serving ``verlmon_build_info``: Prometheus's newest sample moves with
    the clock, so the app's window moves and every live refresh queries fresh data."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server API
                body = b'verlmon_build_info{version="bench"} 1\n'
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


def bench(kind: str, value: str, window: str,
          workdir: Path) -> tuple[dict, dict[str, tuple[float, float]]]:
    proc, url = start_app(kind, value)
    floor_proc, floor_url = start_baseline(workdir, "floor")
    bare_proc, bare_url = start_baseline(workdir, "bare")
    frame_proc, frame_url = start_frame(workdir, kind, value) if "" in PAGES else (None, None)
    feeder = StoreFeeder(Path(value)) if kind == "store" else None
    try:
        pages, base = page_times(url, window, floor_url, bare_url, frame_url=frame_url)
        if feeder is not None:
            feeder.start()
        refresh = refresh_times(url, window)
    finally:
        if feeder is not None and feeder.ident is not None:
            feeder.halt.set()
            feeder.join(10)
        for p in (proc, floor_proc, bare_proc, frame_proc):
            if p is not None:
                p.terminate()
                p.wait(20)
    rows = {PAGES[p]: {"cold_s": round(t.cold, 2), "warm_s": round(t.warm, 2),
                       "nav_s": round(t.nav, 2), "charts/tables": t.drawn,
                       "refresh_server_s": round(refresh[p], 3),
                       "warm_x_floor": round(t.x_floor, 2), "warm_x_bare": round(t.x_bare, 2)}
            for p, t in pages.items()}
    return rows, base


def print_table(title: str, rows: dict, base: dict[str, tuple[float, float]]) -> None:
    print(f"\n{title}")
    print(f"{'page':<16}{'cold s':>8}{'warm s':>8}{'x floor':>9}{'x bare':>8}{'nav s':>8}"
          f"{'drawn':>8}{'refresh s':>11}   (warm: median of 3 URL loads; drawn: charts/tables)")
    for name, label, drawn in (("floor", "(floor page)", "1/0"), ("bare", "(bare page)", "0/0"),
                               ("frame", "(app frame)", "0/0")):
        if name not in base:
            continue
        cold, warm = base[name]
        x_floor = warm / base["floor"][1]
        x_bare = warm / base["bare"][1]
        print(f"{label:<16}{cold:>8.2f}{warm:>8.2f}{x_floor:>9.2f}{x_bare:>8.2f}{'':>8}"
              f"{drawn:>8}{'':>11}")
    for page, r in rows.items():
        print(f"{page:<16}{r['cold_s']:>8.2f}{r['warm_s']:>8.2f}{r['warm_x_floor']:>9.2f}"
              f"{r['warm_x_bare']:>8.2f}{r['nav_s']:>8.2f}{r['charts/tables']:>8}"
              f"{r['refresh_server_s']:>11.3f}")


def _rounded(base: dict[str, tuple[float, float]]) -> dict:
    return {k: {"cold": round(c, 2), "warm": round(w, 2)} for k, (c, w) in base.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-store", action="store_true", help="skip the 8 GPU x 6 h store")
    parser.add_argument("--skip-prometheus", action="store_true",
                        help="skip the 128 node x 8 GPU Prometheus backfill")
    parser.add_argument("--nodes", type=int, default=128, help="nodes in the Prometheus case")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON")
    parser.add_argument("--pages", metavar="NAMES",
                        help="only these pages, comma-separated titles (e.g. Overview)")
    args = parser.parse_args(argv)
    if args.pages:
        wanted = {w.strip().lower() for w in args.pages.split(",")}
        for path in [p for p, title in PAGES.items() if title.lower() not in wanted]:
            del PAGES[path]
        if not PAGES:
            parser.error(f"--pages {args.pages!r} names no page")
    results: dict = {"cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2)}
    with tempfile.TemporaryDirectory(prefix="verlmon-bench-") as tmp:
        tmp = Path(tmp)
        if not args.skip_store:
            t0 = time.perf_counter()
            info = build_store(tmp / "six.db")
            info["build_s"] = round(time.perf_counter() - t0, 1)
            rows, base = bench("store", str(tmp / "six.db"), "6 h", tmp)
            results["store_8gpu_6h_1s"] = {"data": info, "pages": rows,
                                           "baseline_pages_s": _rounded(base)}
            print_table(f"run store, 8 GPUs x 6 h at 1 s ({info['gpu_samples']:,} GPU rows; "
                        f"window 6 h)", rows, base)
        if not args.skip_prometheus:
            if shutil.which("prometheus") is None or shutil.which("promtool") is None:
                print("prometheus/promtool not installed: skipping the Prometheus case")
            else:
                workdir = tmp / "prom"
                workdir.mkdir()
                beat = HeartbeatTarget()
                prom, url, info = build_prometheus(workdir, args.nodes, beat.port)
                try:
                    rows, base = bench("prometheus", url, "1 h", tmp)
                finally:
                    prom.terminate()
                    prom.wait(20)
                    beat.close()
                results[f"prometheus_{args.nodes}x8_1h_15s"] = {
                    "data": info, "pages": rows,
                    "baseline_pages_s": _rounded(base)}
                print_table(f"Prometheus (TSDB backfill), {args.nodes} nodes x 8 GPUs x 1 h at "
                            f"15 s ({info['gpu_samples']:,} GPU samples; window 1 h)", rows,
                            base)
    print(f"\nmachine: {results['cpus']} CPUs, load average {results['load_avg_1m']} "
          "(shared; figures are wall-clock)")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
