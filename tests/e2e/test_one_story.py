"""One story on every surface (issue 31): one real run at speed 1, two exporters on one host.

- ``node-a`` simulates a straggler (``gpu_imbalance``: one GPU's SMs busy in update_actor while
  the others spin in the collectives), ``node-b`` a healthy node; both on 127.0.0.1, each with
  its own ``--node``, log and store.
- ``verl-monitor prometheus-config`` writes the job's targets (it asks each exporter its node
  name) and the Prometheus config; a real Prometheus loads it (1 s scrape and evaluation, so
  a minute or two of run is enough) with the repository's rules, alerting through the
  repository's Alertmanager config to a local HTTP receiver standing in for Slack.
- ``verl-monitor dashboard --store`` on node-a's store and ``verl-monitor dashboard
  --prometheus`` on that Prometheus, in a real headless Chromium.

Checked: the straggler flag's evidence, as the store holds it, is the text of the Overview's
top open problem from the store, of the Overview's top open problem from Prometheus, and of
the Slack post Alertmanager delivered (no "...#digest", no cut), with every piece of the
flag's advice on each; the GPUs page shows the straggler's SM in the flag's phase; the Nodes
page from Prometheus counts two nodes, and one once node-b stops reporting (after
Prometheus's staleness). Then node-a's run ends (the simulator writes the exit marker beside
its log): the Overview from the store shows no open warning or critical flag (banner, open-flags
count, no top problem), and the per-phase bar of Steps & phases ("Where the GPU time goes")
gives each phase the share of the step that ``verl-monitor analyze --json`` gives it on the
run's exported store.
Screenshots and the Slack text go to ``test-artifacts/one_story/``; with
``VERLMON_REFRESH_DOCS=1`` they replace ``docs/screenshots/one_story_*`` (how the README's
pictures are made), so an ordinary test run leaves the tracked docs alone.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from procs import (
    NEEDS_CHROMIUM,
    NEEDS_PROMETHEUS,
    PROMETHEUS_BIN,
    PrometheusProc,
    WebhookRecorder,
    free_port,
    repo_alertmanager_config,
    start_alertmanager,
    start_dashboard,
    start_process,
    wait_until,
)
from test_dashboard_demo import (  # noqa: F401 - the same Chromium and viewport
    browser_context_args,
    browser_type_launch_args,
)

from monitor.store.runstore import RunStore

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.slow,
    NEEDS_CHROMIUM,
    NEEDS_PROMETHEUS,
]

REPO = Path(__file__).resolve().parents[2]
SHOTS = (REPO / "docs" / "screenshots" if os.environ.get("VERLMON_REFRESH_DOCS") == "1"
         else REPO / "test-artifacts" / "one_story")
CLI = str(Path(sys.executable).parent / "verl-monitor")
JOB = "story"
#: node -> scenario: a straggler for 5 steps (~38 s each: its run ends after ~3 minutes at speed 1),
#: and a healthy node (stopped before its run ends)
NODES = {"node-a": "gpu_imbalance:5", "node-b": "healthy:10"}
GPUS = 4


def _exporter(tmp: Path, node: str, scenario: str, port: int):
    work = tmp / node
    return start_process(
        [CLI, "exporter", "--listen-address", f"127.0.0.1:{port}", "--node", node,
         "--gpu-backend", "sim", "--scenario", scenario, "--sim-gpus", str(GPUS), "--seed", "0",
         "--sim-log", str(work / "train.log"), "--sim-speed", "1", "--interval", "1",
         "--detect-interval", "5", "--no-collector.nccl", "--store", str(work / "run.db")],
        work, f"exporter-{node}", port, f"http://127.0.0.1:{port}/metrics", timeout=60,
        env={"PYTHONUNBUFFERED": "1"})


def _prometheus(tmp: Path, targets_dir: Path, ports: dict[str, int],
                am_port: int) -> PrometheusProc:
    """The targets and the config ``prometheus-config`` writes (the targets as an operator
    gives them, host:port only: the exporters say their node names), at a 1 s cadence; alerts
    resent every second, so Alertmanager holds the rules' current words."""
    cfg = tmp / "prom" / "prometheus.yml"
    cfg.parent.mkdir(parents=True)
    assert _cli(["prometheus-config", "--job", JOB, "--targets-dir", str(targets_dir),
                 "--targets", ",".join(f"127.0.0.1:{p}" for p in ports.values()),
                 "--config", str(cfg), "--alertmanager", f"127.0.0.1:{am_port}"]) == 0
    groups = json.loads((targets_dir / f"{JOB}.json").read_text())
    assert [g["labels"]["node"] for g in groups] == list(NODES)  # not "127.0.0.1" twice
    conf = yaml.safe_load(cfg.read_text())
    conf["global"].update(scrape_interval="1s", evaluation_interval="1s", scrape_timeout="1s")
    cfg.write_text(yaml.safe_dump(conf, sort_keys=False))
    port = free_port()
    proc = start_process(
        [PROMETHEUS_BIN, f"--config.file={cfg}", f"--storage.tsdb.path={cfg.parent / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", "--rules.alert.resend-delay=1s",
         "--log.level=warn"], cfg.parent, "prometheus", port,
        f"http://127.0.0.1:{port}/-/ready", proc_cls=PrometheusProc)
    assert isinstance(proc, PrometheusProc)
    return proc


def _cli(argv: list[str]) -> int:
    from cli.main import main

    return main(argv)


def _open(page, url: str) -> None:
    page.goto(url)
    page.locator("[data-testid='stApp'][data-test-script-state='notRunning']").wait_for(
        state="attached", timeout=90_000)


def _top_flag(page, base: str) -> str:
    _open(page, f"{base}/?window=15+min&refresh=off")
    top = page.locator(".st-key-ov_top_flag")
    top.wait_for(timeout=60_000)
    # the pages put an invisible word joiner (U+2060) after each colon (no :emoji: shortcode)
    return " ".join(top.inner_text().replace("\u2060", "").split())


def _slack_text(post: dict) -> str:
    body = post["body"]
    texts = [a.get("text", "") for a in body.get("attachments", [])] + [body.get("text", "")]
    text = " ".join(" ".join(texts).split())
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def _straggler(store: Path):
    flags = [f for f in RunStore(store, create=False).flags()
             if f.kind == "gpu_imbalance" and f.end is None]
    return flags[0] if flags else None


@pytest.mark.timeout(900)
def test_one_story_on_every_surface(tmp_path, page):
    targets_dir = tmp_path / "targets"
    ports = {node: free_port() for node in NODES}
    procs = []
    with WebhookRecorder() as slack:
        am_cfg = repo_alertmanager_config(tmp_path / "am", slack.url + "/services/T/B/x",
                                          repeat_interval="5s")
        with start_alertmanager(tmp_path / "am", am_cfg) as am:
            try:
                for node, scenario in NODES.items():
                    procs.append(_exporter(tmp_path, node, scenario, ports[node]))
                prom = _prometheus(tmp_path, targets_dir, ports, am.port)
                procs.append(prom)
                apps = {}
                for name, source in (("store", ["--store", str(tmp_path / "node-a" / "run.db")]),
                                     ("prom", ["--prometheus", prom.url, "--job", JOB])):
                    procs.append(start_dashboard(CLI, source, tmp_path / name,
                                                 f"dashboard-{name}"))
                    apps[name] = procs[-1].url
                _same_words_everywhere(page, tmp_path / "node-a" / "run.db", apps, slack)
                _gpus_page_shows_the_straggler(page, apps["store"])
                _two_nodes_then_one(page, apps["prom"], prom, procs, ports)
                _the_end_closes_every_loud_flag(page, tmp_path / "node-a", apps["store"])
                _the_bar_agrees_with_analyze(page, tmp_path / "node-a", apps["store"])
            finally:
                for p in reversed(procs):
                    p.stop()


def _same_words_everywhere(page, store: Path, apps: dict[str, str], slack) -> None:
    """The store's straggler evidence on both Overviews and in Alertmanager's Slack post, at
    one moment (the evidence's step range grows with each step: compared until one round
    sees the same words on all three)."""
    flag = wait_until(lambda: _straggler(store), timeout=240, interval=2,
                      what="node-a's gpu_imbalance flag in its store")
    print("store flag:", flag.evidence, flag.advice, flush=True)
    seen: dict[str, str] = {}

    def agree() -> bool:
        current = _straggler(store)
        if current is None:
            return False
        posts = [p for p in slack.snapshot()
                 if "FIRING" in json.dumps(p["body"]) and "gpu_imbalance" in json.dumps(p["body"])]
        seen.update(store=_top_flag(page, apps["store"]), prom=_top_flag(page, apps["prom"]),
                    slack=_slack_text(posts[-1]) if posts else "")
        seen["evidence"] = " ".join(current.evidence.split())
        seen["advice"] = json.dumps(current.advice)
        words = [seen["evidence"], *(" ".join(a.split()) for a in current.advice)]
        return all(w in seen[s] for w in words for s in ("store", "prom", "slack"))

    try:
        wait_until(agree, timeout=240, interval=1, what="the same flag words on every surface")
    finally:
        print("seen:", json.dumps(seen, indent=1), flush=True)
    for surface in ("prom", "slack"):
        assert "...#" not in seen[surface] and "…" not in seen[surface], seen[surface]
    # the pictures the issue quotes: the same words from the store and from Prometheus
    SHOTS.mkdir(parents=True, exist_ok=True)
    for name in ("store", "prom"):
        _top_flag(page, apps[name])
        page.screenshot(path=SHOTS / f"one_story_overview_{name}.png", full_page=True)
    (SHOTS / "one_story_slack.txt").write_text(seen["slack"] + "\n")


def _gpus_page_shows_the_straggler(page, base: str) -> None:
    """The GPUs table has the SM of each GPU in the flag's phase (the straggler's column)."""
    from test_dashboard_tables import TABLES_JS  # the grid's column titles (drawn on a canvas)

    def titles() -> list[str]:
        _open(page, f"{base}/gpus?window=15+min&refresh=off")
        page.locator("[data-testid=stDataFrame] .dvn-scroller").first.wait_for(timeout=60_000)
        return [c["title"] for t in page.evaluate(TABLES_JS) for c in t["columns"]]

    got = wait_until(lambda: (lambda t: t if "SM % in update_actor" in t else None)(titles()),
                     timeout=120, interval=2, what="the GPUs table's update_actor columns")
    assert "util % in update_actor" in got, got
    page.screenshot(path=SHOTS / "one_story_gpus.png", full_page=True)


def _nodes_count(page, base: str) -> str:
    _open(page, f"{base}/nodes?window=15+min&refresh=off")
    metric = page.get_by_test_id("stMetric").filter(has_text="Nodes").first
    metric.wait_for(timeout=60_000)
    return metric.get_by_test_id("stMetricValue").inner_text().strip()


def _two_nodes_then_one(page, base: str, prom: PrometheusProc, procs: list, ports) -> None:
    """Two exporters on one host are two nodes; node-b stopped is not counted once
    Prometheus marks its series stale."""
    got = prom.query(f'count by (node) (verlmon_gpu_utilization_ratio{{job="{JOB}"}})')
    assert sorted(r["metric"]["node"] for r in got) == sorted(NODES), got
    assert wait_until(lambda: _nodes_count(page, base) == "2", timeout=60,
                      what="Nodes 2 on the Nodes page")
    page.screenshot(path=SHOTS / "one_story_nodes.png", full_page=True)
    node_b = next(p for p in procs if getattr(p, "name", "") == "exporter-node-b")
    node_b.stop()
    stopped = time.monotonic()
    wait_until(lambda: not prom.query(
        f'verlmon_gpu_utilization_ratio{{job="{JOB}",node="node-b"}}'), timeout=30,
        what="node-b's series stale in Prometheus")
    print(f"node-b stale after {time.monotonic() - stopped:.1f} s", flush=True)
    assert wait_until(lambda: _nodes_count(page, base) == "1", timeout=60,
                      what="Nodes 1 once node-b stopped reporting")


def _finished_overview(page, base: str) -> dict | None:
    """The Overview from the store once no warning or critical flag is open: its banner, its
    open-flags count and whether a top open problem is shown (None while one is shown)."""
    _open(page, f"{base}/?window=15+min&refresh=off")
    # (the alert's text starts with its icon's name: no "^")
    banner = page.get_by_test_id("stAlert").filter(
        has_text=re.compile(r"Healthy|Needs attention|Finished")).first
    banner.wait_for(timeout=60_000)
    seen = {"banner": " ".join(banner.inner_text().split()),
            "open": page.locator("[data-verlmon-stat='Open flags'] [data-verlmon-value]")
            .first.inner_text().strip(),
            "top": page.locator(".st-key-ov_top_flag").count()}
    print("finished overview:", seen, flush=True)
    loud = re.search(r"\d+ (warning|critical)", seen["banner"])
    return None if loud or seen["top"] or seen["open"] != "0" else seen


def _the_end_closes_every_loud_flag(page, work: Path, base: str) -> None:
    """node-a's simulated run ends (the exit marker beside its log): its open flags close as
    "run finished", and the Overview from the store says no warning or critical flag is open."""
    marker = work / "train.log.exit"
    wait_until(marker.exists, timeout=240, interval=2, what="node-a's run's exit marker")
    print(f"node-a's run ended: {marker.read_text()}", flush=True)
    store = RunStore(work / "run.db", create=False)
    wait_until(lambda: not [f for f in store.flags() if f.end is None
                            and f.severity in ("warning", "critical")],
               timeout=60, interval=1, what="no open warning or critical flag in the store")
    closed = [f for f in store.flags() if f.kind == "gpu_imbalance"]
    assert closed and all("run finished" in f.evidence for f in closed), closed
    seen = wait_until(lambda: _finished_overview(page, base), timeout=90, interval=2,
                      what="the Overview without an open warning or critical flag")
    assert "Needs attention" not in seen["banner"], seen
    page.screenshot(path=SHOTS / "one_story_finished.png", full_page=True)


#: a measured phase's segment and the short phases' block on the headline bar (hover texts)
PHASE_TIP = re.compile(r"^(\w+): (\d+)% of the step, GPUs (\d+)% busy in it$")
SHORT_TIP = re.compile(r"^([\w, ]+): each shorter than the samples can resolve; "
                       r"together (\d+)% of the step")


def _bar_shares(page) -> dict[str, float]:
    """Phase (or "a+b" for the short phases' block) -> its share of the step (%) on the
    per-phase "Where the GPU time goes" bar of Steps & phases, read from the segments' hover
    texts."""
    bar = page.get_by_test_id("verlmon-gpu-time-bar").first
    bar.wait_for(timeout=60_000)
    tips = bar.locator("xpath=..").evaluate(
        "el => Array.from(el.querySelectorAll('[title]')).map(e => e.title)")
    shares: dict[str, float] = {}
    for tip in tips:
        if m := PHASE_TIP.match(tip):
            shares[m[1]] = float(m[2])
        elif m := SHORT_TIP.match(tip):
            shares["+".join(p.strip() for p in m[1].split(","))] = float(m[2])
    return shares


def _the_bar_agrees_with_analyze(page, work: Path, base: str) -> None:
    """Each phase's share of the step on the finished run's headline bar is the share
    ``analyze --json`` gives it on the exported store (the short phases' block: their sum)."""
    out = work / "export"
    assert _cli(["export", str(work / "run.db"), "--out", str(out)]) == 0
    r = subprocess.run([CLI, "analyze", str(out / "train.jsonl"), "--gpu", str(out / "gpu.csv"),
                        "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    share = {p["phase"]: 100.0 * p["share"] for p in doc["summary"]["phases"]}
    _open(page, f"{base}/steps?window=15+min&refresh=off")
    shown = _bar_shares(page)
    print("bar:", shown, "analyze:", {p: round(v, 1) for p, v in share.items()}, flush=True)
    assert "update_actor" in shown, shown  # the flag's phase, measured from its samples
    for phases, pct in shown.items():
        assert set(phases.split("+")) <= set(share), (phases, share)
        want = sum(share[p] for p in phases.split("+"))
        assert abs(pct - want) <= 3.0, (phases, pct, want)
