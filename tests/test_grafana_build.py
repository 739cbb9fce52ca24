"""grafana/build.py: the committed dashboards are what the generator writes, and lint clean."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from monitor import metric_names

REPO = Path(__file__).resolve().parents[1]
GRAFANA = REPO / "grafana"
COMMITTED = GRAFANA / "dashboards"
BUILD = GRAFANA / "build.py"


def _load_build():
    spec = importlib.util.spec_from_file_location("verlmon_grafana_build", BUILD)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


build = _load_build()
STEMS = ["verlmon-overview", "verlmon-gpus", "verlmon-phases", "verlmon-cluster",
         "verlmon-rollout"]


def _boards() -> dict[str, dict]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(COMMITTED.glob("*.json"))}


def _panels(board: dict) -> list[dict]:
    return [p for p in board["panels"] if p["type"] != "row"]


def _exprs(board: dict) -> list[str]:
    return [t["expr"] for p in _panels(board) for t in p["targets"]]


@pytest.mark.slow
def test_regenerated_json_matches_the_committed_files(tmp_path):
    proc = subprocess.run([sys.executable, str(BUILD), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    fresh = sorted(p.name for p in tmp_path.glob("*.json"))
    committed = sorted(p.name for p in COMMITTED.glob("*.json"))
    assert fresh == committed, "dashboards added or removed: run python grafana/build.py"
    for name in fresh:
        assert (tmp_path / name).read_text() == (COMMITTED / name).read_text(), (
            f"{name} differs from the generator's output: run python grafana/build.py"
        )


@pytest.mark.slow
def test_check_flags_an_edited_dashboard_and_passes_a_fresh_one(tmp_path):
    shutil.copytree(COMMITTED, tmp_path / "d")
    ok = subprocess.run([sys.executable, str(BUILD), "--check", "--out", str(tmp_path / "d")],
                        capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0, ok.stderr
    edited = tmp_path / "d" / "verlmon-gpus.json"
    edited.write_text(edited.read_text().replace("SM active", "SM busy"))
    bad = subprocess.run([sys.executable, str(BUILD), "--check", "--out", str(tmp_path / "d")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert "verlmon-gpus.json" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_unwritable_output_is_one_line_and_status_2(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    proc = subprocess.run([sys.executable, str(BUILD), "--out", str(blocker / "sub")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_the_five_dashboards_have_unique_uids_and_titles():
    boards = _boards()
    assert set(boards) == set(STEMS)
    for stem, board in boards.items():
        assert board["uid"] == stem
    assert len({b["title"] for b in boards.values()}) == len(STEMS)
    for stem, board in boards.items():
        titles = [p["title"] for p in _panels(board)]
        assert len(set(titles)) == len(titles), f"{stem}: two panels share a title"


@pytest.mark.parametrize("stem", STEMS)
def test_every_panel_has_a_unit_a_datasource_and_queries(stem):
    board = _boards()[stem]
    panels = _panels(board)
    assert len(panels) >= 6
    for panel in panels:
        title = panel["title"]
        assert panel["fieldConfig"]["defaults"].get("unit"), f"{title}: no unit"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, title
        assert panel["targets"], f"{title}: no query"
        assert panel.get("description"), f"{title}: no description"
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(set(ref_ids)) == len(ref_ids), f"{title}: duplicate refId"
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", title
            assert target["expr"].strip(), title


@pytest.mark.parametrize("stem", STEMS)
def test_variables_chain_datasource_job_node_gpu(stem):
    variables = {v["name"]: v for v in _boards()[stem]["templating"]["list"]}
    assert list(variables) == ["datasource", "job", "node", "gpu"]
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    for name in ("job", "node", "gpu"):
        var = variables[name]
        assert var["type"] == "query" and var["multi"] and var["includeAll"], name
        assert var["allValue"] == ".+", name
        assert var["datasource"]["uid"] == "${datasource}", name
        assert var["query"].startswith("label_values("), name
    assert "$job" in variables["node"]["query"]
    assert "$job" in variables["gpu"]["query"] and "$node" in variables["gpu"]["query"]


def test_rates_use_rate_interval_and_no_range_is_hard_coded():
    for stem, board in _boards().items():
        for expr in _exprs(board):
            for window in re.findall(r"\b(?:rate|irate|increase)\([^\[]*\[([^\]]+)\]", expr):
                assert window in ("$__rate_interval", "$__range"), f"{stem}: {expr}"
            for window in re.findall(r"\[([^\]]+)\]", expr):
                assert window.startswith("$__"), f"{stem}: hard-coded range in {expr}"


def test_every_selector_honours_the_job_and_node_variables():
    for stem, board in _boards().items():
        for expr in _exprs(board):
            for selector in re.findall(r"\b(?:verlmon_\w+|up)\{([^}]*)\}", expr):
                assert 'job=~"$job"' in selector, f"{stem}: {expr}"


def test_dashboards_only_use_exported_metric_names():
    exported = {v for k, v in vars(metric_names).items() if k.isupper() and
                isinstance(v, str) and v.startswith("verlmon_") and v != metric_names.PREFIX}
    exported |= {h + suffix for h in metric_names.HISTOGRAMS
                 for suffix in ("_bucket", "_sum", "_count")}
    exported |= {s + suffix for s in (metric_names.ROLLOUT_QUEUE_TIME,
                                      metric_names.ROLLOUT_E2E_LATENCY)
                 for suffix in ("_sum", "_count")}  # summaries
    used = set()
    for board in _boards().values():
        for expr in _exprs(board) + [v["query"] for v in board["templating"]["list"]]:
            used.update(re.findall(r"\bverlmon_[a-z0-9_]+", expr))
    unknown = used - exported
    assert not unknown, f"not in monitor/metric_names.py: {sorted(unknown)}"


def test_each_dashboard_covers_what_it_promises():
    boards = _boards()
    wants = {
        "verlmon-overview": ["verlmon_training_step", "verlmon_step_duration_seconds",
                             "verlmon_throughput_tokens_per_second", "verlmon_flag_active",
                             "verlmon_phase_duration_seconds",
                             "verlmon_seconds_since_last_step", "verlmon_flag_info",
                             "verlmon_step_seconds_count", "verlmon_data_wait_seconds_total"],
        "verlmon-gpus": ["verlmon_gpu_utilization_ratio", "verlmon_gpu_sm_active_ratio",
                         "verlmon_gpu_tensor_active_ratio", "verlmon_gpu_dram_active_ratio",
                         "verlmon_gpu_memory_used_bytes", "verlmon_gpu_power_watts",
                         "verlmon_gpu_temperature_celsius", "verlmon_gpu_clock_event_active",
                         "verlmon_gpu_xid_errors_total"],
        "verlmon-phases": ['phase="reshard"', 'phase="rollout_wait"', 'phase="comm"',
                           "verlmon_phase_seconds_total", "verlmon_step_seconds_sum",
                           "verlmon_nccl_comm_share_ratio", "verlmon_nccl_operations_total",
                           "verlmon_nccl_bytes_total",
                           "verlmon_nccl_bus_bandwidth_bytes_per_second"],
        "verlmon-cluster": ["quantile by (job) (0.5, rate(verlmon_gpu_sm_active_seconds_total",
                            "verlmon_gpu_sampled_seconds_total", "up{",
                            "verlmon_gpu_up"],
        "verlmon-rollout": ["verlmon_rollout_kv_cache_usage_ratio", "verlmon_rollout_requests",
                            "verlmon_rollout_preemptions_total",
                            "verlmon_rollout_generation_tokens_total",
                            "verlmon_rollout_queue_time_seconds_sum",
                            "verlmon_rollout_e2e_latency_seconds_count",
                            "verlmon_rollout_sleeping", "verlmon_rollout_server_up",
                            "verlmon_rollout_scrape_errors_total"],
    }
    for stem, needles in wants.items():
        text = "\n".join(_exprs(boards[stem]))
        for needle in needles:
            assert needle in text, f"{stem} has no panel on {needle}"
    heat_maps = [p for p in _panels(boards["verlmon-cluster"]) if p["type"] == "status-history"]
    assert any("by node" in p["title"] for p in heat_maps)
    stacked = [p for p in _panels(boards["verlmon-overview"])
               if p["fieldConfig"]["defaults"].get("custom", {}).get("stacking", {}).get("mode")
               == "normal"]
    assert any("Phase" in p["title"] for p in stacked)


def test_panels_fit_the_grid_without_overlapping():
    for stem, board in _boards().items():
        cells: set[tuple[int, int]] = set()
        for panel in board["panels"]:
            pos = panel["gridPos"]
            assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24, f"{stem}: {panel['title']}"
            mine = {(pos["x"] + dx, pos["y"] + dy)
                    for dx in range(pos["w"]) for dy in range(pos["h"])}
            assert not cells & mine, f"{stem}: {panel['title']} overlaps another panel"
            cells |= mine


def test_provisioning_files_point_grafana_at_prometheus_and_the_dashboards():
    ds = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    assert ds["apiVersion"] == 1
    (source,) = ds["datasources"]
    assert source["type"] == "prometheus" and source["url"].startswith("http")
    assert source["jsonData"]["timeInterval"].endswith("s")
    prov = yaml.safe_load((GRAFANA / "provisioning/dashboards/verl-monitor.yml").read_text())
    (provider,) = prov["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]


def test_render_is_deterministic():
    for board in build.BOARDS:
        assert build.render(board) == build.render(board)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_every_query_parses_as_promql(tmp_path):
    """promtool parses each panel query (variables filled in as Grafana would)."""
    rules = []
    for stem, board in _boards().items():
        for i, expr in enumerate(_exprs(board)):
            filled = (expr.replace("$__rate_interval", "1m").replace("$__range", "5m")
                      .replace("$job", ".+").replace("$node", ".+").replace("$gpu", ".+"))
            rules.append({"record": f"check:{stem.replace('-', '_')}:q{i}", "expr": filled})
    path = tmp_path / "panels.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "panels", "rules": rules}]}))
    proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_committed_json_round_trips_through_the_sdk_dashboard_model():
    """The files parse as Grafana dashboard models (typed panels, targets, variables)."""
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models.dashboard import Dashboard

    for stem, board in _boards().items():
        model = Dashboard.from_json(board)
        assert json.loads(JSONEncoder(sort_keys=True).encode(model)) == board, stem
